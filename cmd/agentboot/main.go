// Command agentboot runs agentboot's server components: `manager` (the
// controllers, and the agent API unless it runs apart), `agent-api` (the
// agent API on its own), `dev` (all of it on a local control plane),
// `image-service` (discovery images, for scaling apart from the manager),
// `pxe` (DHCP, TFTP and HTTP for network boot, on the boot network), and
// for operators `trace` (a host's boot path) and `ui` (a live page of the
// hosts), both reading with the operator's own rights.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string) error
}

var commands = []command{
	{"manager", "run the controllers (and, unless --agent-api-addr is empty, the agent API) against a cluster", runManager},
	{"agent-api", "serve the agent API on its own, reading no Secret (as deployed)", runAgentAPI},
	{"image-service", "serve discovery ISOs, PXE artifacts and Ignition configs", runImageService},
	{"pxe", "answer network boot (ProxyDHCP or DHCP, TFTP, HTTP) on the boot network", runPXE},
	{"dev", "run a local control plane with everything agentboot serves (make run)", runDev},
	{"trace", "show where a host is on its boot path, by MAC or Agent, and why it stopped (with your kubeconfig's rights)", runTrace},
	{"classify-worker", "run AgentClassification queries for the manager, one a line on stdin (the manager starts it)", runClassifyWorker},
	{"ui", "serve a live page of the hosts by InfraEnv on this machine (with your kubeconfig's rights)", runUI},
	{"version", "print the version", func(context.Context, []string) error { fmt.Println(version); return nil }},
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: agentboot <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-14s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(os.Stderr, "\n`agentboot <command> -h` lists a command's flags.\n")
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	name := os.Args[1]
	for _, c := range commands {
		if c.name != name {
			continue
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := c.run(ctx, os.Args[2:])
		stop()
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "agentboot %s: %v\n", name, err)
			os.Exit(1)
		}
		return
	}
	if name == "-h" || name == "--help" || name == "help" {
		usage()
		return
	}
	fmt.Fprintf(os.Stderr, "agentboot: unknown command %q\n\n", name)
	usage()
	os.Exit(2)
}
