// Command agent is agentboot's on-host discovery agent: a small static binary
// that the discovery image starts. It must not link client-go.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/agentboot/agentboot/agent"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/sanitize"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func usage() {
	fmt.Fprint(os.Stderr, `usage: agent <command> [flags]

commands:
  run              register with agentboot and heartbeat (the discovery service)
  inventory        print this host's hardware inventory as JSON
  static-network   write this host's static network configuration for NetworkManager
  install          write an OS disk image to a disk with an Ignition config, as the install step does
  sanitize         erase disks as a released host's are (docs/security.md), printing the evidence as JSON
  version          print the version
`)
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var err error
	switch os.Args[1] {
	case "run":
		err = run(ctx, os.Args[2:], log)
	case "inventory":
		err = inventory(ctx, os.Args[2:])
	case "static-network":
		err = staticNetwork(os.Args[2:], log)
	case "install":
		err = install(ctx, os.Args[2:], log)
	case "sanitize":
		err = sanitizeDisks(ctx, os.Args[2:], log)
	case "version":
		fmt.Println(version)
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "agent: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "agent %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cfgPath := fs.String("config", agentwire.ConfigPath, "agent config written by the discovery Ignition")
	if err := fs.Parse(args); err != nil {
		return err
	}
	a, err := agent.New(agent.Config{ConfigPath: *cfgPath, Version: version, Log: log, SessionPath: "/run/agentboot/session.json"})
	if err != nil {
		return err
	}
	err = a.Run(ctx)
	if errors.Is(err, agent.ErrInfraEnvGone) {
		// Not a failure: there is nothing left to register with. Exiting
		// zero keeps the unit from restarting in a hot loop.
		return nil
	}
	return err
}

func inventory(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("inventory", flag.ContinueOnError)
	root := fs.String("root", "/", "read the hardware below this directory (for tests)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	inv, err := agent.Inventory(ctx, *root)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(inv)
}

func staticNetwork(args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("static-network", flag.ContinueOnError)
	cfg := fs.String("config", "/etc/agentboot/static-networks.json", "static network configs from the discovery Ignition")
	out := fs.String("out", "/etc/nmstate", "directory NetworkManager's nmstate service applies")
	if err := fs.Parse(args); err != nil {
		return err
	}
	msg, err := agent.ApplyStaticNetwork("/", *cfg, *out)
	if err != nil {
		return err
	}
	log.Info(msg)
	return nil
}

func install(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	var step agentwire.InstallStep
	fs.StringVar(&step.DiskPath, "disk", "", "the disk to install to (everything on it is replaced)")
	fs.StringVar(&step.ImageURL, "image-url", "", "raw (or gzip-compressed raw) OS disk image")
	fs.StringVar(&step.ImageSHA256, "image-sha256", "", "sha256 of the image as downloaded")
	ignition := fs.String("ignition-file", "", "Ignition config the installed OS reads on first boot")
	reboot := fs.Bool("reboot", false, "reboot into the installed OS when done")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ignition == "" {
		return errors.New("--ignition-file is required")
	}
	data, err := os.ReadFile(*ignition)
	if err != nil {
		return err
	}
	step.Ignition = string(data)
	if err := agent.Install(ctx, step, func(stage string, pct int, info string) {
		log.Info(stage, "percentage", pct, "info", info)
	}); err != nil {
		return err
	}
	if *reboot {
		syscall.Sync()
		return syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
	}
	return nil
}

// repeated is a flag that may be given more than once.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func sanitizeDisks(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("sanitize", flag.ContinueOnError)
	var disks, keep repeated
	fs.Var(&disks, "disk", "a disk to sanitize (repeat for more; everything on it is erased)")
	fs.Var(&keep, "keep", "a disk given with --disk to leave alone (repeat for more)")
	levelFlag := fs.String("level", string(sanitize.Erase), "none, metadata or erase")
	method := fs.String("method", "", "at level erase, this method instead of the fastest on every disk (which must offer it): "+strings.Join(agent.SentMethods(), ", "))
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(disks) == 0 {
		return errors.New("--disk is required: name each disk to sanitize")
	}
	level, err := sanitize.ParseLevel(*levelFlag)
	if err != nil {
		return err
	}
	evidence, err := agent.Sanitize(ctx, level, sanitize.Method(*method), disks, keep, log)
	enc := json.NewEncoder(os.Stdout)
	for _, ev := range evidence {
		if encErr := enc.Encode(ev); encErr != nil {
			return errors.Join(err, encErr)
		}
	}
	return err
}
