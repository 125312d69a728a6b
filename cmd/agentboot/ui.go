package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/agentboot/agentboot/internal/ui"
)

// runUI serves the hosts page on the operator's machine, reading with the
// operator's own kubeconfig (docs/ui.md).
func runUI(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ui", flag.ContinueOnError)
	var (
		kubeconfig = fs.String("kubeconfig", "", "kubeconfig to use; defaults to $KUBECONFIG or ~/.kube/config")
		namespace  = fs.String("n", "", "watch only this namespace (default: every namespace you may list, else the kubeconfig context's)")
		listen     = fs.String("listen", "127.0.0.1:8090", "where the page is served: a loopback address (the page acts with your credentials)")
		home       = fs.String("agentboot-namespace", "agentboot-system", "agentboot's namespace, where the traces of MACs nothing claims are kept")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--listen %s: the page acts with your credentials, so it is served on a loopback address only (use an SSH tunnel to view it from elsewhere)", *listen)
	}
	cfg, fallback, err := operatorKubeconfig(*kubeconfig)
	if err != nil {
		return err
	}
	log, err := newLogger(os.Stderr, "info", "text")
	if err != nil {
		return err
	}
	srv := &ui.Server{Config: cfg, Namespace: *namespace, Fallback: fallback, Home: *home, Log: log.WithName("ui")}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(shut)
	}()
	errc := make(chan error, 1)
	go func() {
		err := srv.Start(ctx)
		if err != nil {
			// The page would wait for data forever: stop, saying why.
			_ = hs.Close()
		}
		errc <- err
	}()
	fmt.Fprintf(os.Stderr, "agentboot ui: open %s\n", srv.URL(l.Addr().String()))
	if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return <-errc
}
