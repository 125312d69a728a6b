package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/internal/scheme"
)

func runTrace(ctx context.Context, args []string) error { return traceCommand(ctx, args, os.Stdout) }

// traceCommand prints a host's boot path (docs/trace.md), read with the
// kubeconfig's own rights.
func traceCommand(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: agentboot trace [flags] <MAC | Agent name>\n\n"+
			"Where a host is on its boot path (DHCP, TFTP, boot script, kernel, initrd, root file system or ISO,\n"+
			"registration, inventory, heartbeats), where it stopped and the likely reason, by a MAC of the host\n"+
			"or by its Agent, read with your own Kubernetes rights.\n\nflags:\n")
		fs.PrintDefaults()
	}
	var (
		kubeconfig = fs.String("kubeconfig", "", "kubeconfig to use; defaults to $KUBECONFIG or ~/.kube/config")
		namespace  = fs.String("n", "", "the namespace of the Agent, or where to look for a MAC's trace when you may not read all (default: the kubeconfig context's)")
		home       = fs.String("agentboot-namespace", "agentboot-system", "agentboot's namespace, where the traces of MACs nothing claims are kept")
	)
	// Flags may follow the argument, as with kubectl.
	var positional []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(positional) != 1 {
		fs.Usage()
		return fmt.Errorf("want one MAC address or Agent name, got %d arguments", len(positional))
	}
	cfg, ns, err := operatorKubeconfig(*kubeconfig)
	if err != nil {
		return err
	}
	if *namespace != "" {
		ns = *namespace
	}
	s, err := scheme.New()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return err
	}
	reports, err := boottrace.Lookup(ctx, c, positional[0], ns, *home)
	if err != nil {
		return err
	}
	for i, r := range reports {
		if i > 0 {
			fmt.Fprintln(out)
		}
		writeReport(out, r, time.Now())
	}
	return nil
}

// operatorKubeconfig loads an operator's kubeconfig (the path, or
// $KUBECONFIG, or ~/.kube/config) and its context's namespace.
func operatorKubeconfig(path string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("load kubeconfig: %w", err)
	}
	ns, _, err := loader.Namespace()
	if err != nil {
		return nil, "", err
	}
	return cfg, ns, nil
}

func writeReport(out io.Writer, r boottrace.Report, now time.Time) {
	switch {
	case r.MAC != "":
		fmt.Fprintf(out, "MAC %s\n", r.MAC)
	default:
		fmt.Fprintf(out, "MAC unknown: the Agent's inventory lists no interface\n")
	}
	if t := r.Trace; t != nil {
		switch {
		case r.Unclaimed:
			fmt.Fprintf(out, "  not claimed by any InfraEnv: %s\n", t.Status.Claim)
		case t.Status.InfraEnv != "":
			fmt.Fprintf(out, "  boots InfraEnv %s\n", t.Status.InfraEnv)
		}
		fmt.Fprintf(out, "  trace: BootTrace %s/%s\n", t.Namespace, t.Name)
	} else {
		fmt.Fprintf(out, "  no boot trace: agentboot's services have not seen this MAC boot, or you may not read its trace\n")
	}
	if a := r.Agent; a != nil {
		fmt.Fprintf(out, "  Agent %s/%s\n", a.Namespace, a.Name)
	} else {
		fmt.Fprintf(out, "  no Agent: no host with this MAC registered, or you may not read its Agent\n")
	}
	if len(r.Hidden) > 0 {
		fmt.Fprintf(out, "  not readable with your rights: %s\n", strings.Join(r.Hidden, "; "))
	}
	path := boottrace.Path(r.Trace, r.Agent)
	if len(path) > 0 {
		fmt.Fprintln(out)
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HOP\tLAST SEEN\tOK\tSEEN BY\tCOUNT\tWHAT")
		for _, s := range path {
			ok := "yes"
			if !s.OK {
				ok = "NO"
			}
			what := s.Outcome
			if s.Detail != "" {
				what += " (" + s.Detail + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", s.Hop, s.At.UTC().Format(time.RFC3339), ok, s.Source, s.Count, what)
		}
		tw.Flush()
	}
	d := r.Diagnosis
	fmt.Fprintln(out)
	if d.Stopped != "" {
		state := "Stopped at"
		if d.Done {
			state = "Reached"
		}
		fmt.Fprintf(out, "%s: %s, %s (%s ago)\n", state, d.Stopped, d.Since.UTC().Format(time.RFC3339), now.Sub(d.Since).Round(time.Second))
	}
	fmt.Fprintf(out, "Likely: %s\n", d.Reason)
}
