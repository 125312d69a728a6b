package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
)

// needs are the files and directories a process's flags name, which come
// from what a Deployment mounts and sets: checked before it starts, so that
// a Secret without a key, a volume not mounted or a ConfigMap without a key
// is named where an operator looks (the log, and the readiness probe's
// answer) instead of ending the process with a crash loop.
type needs struct {
	// Files are flags naming files the process reads (certificates, keys,
	// CA bundles); Writable flags naming directories it writes.
	Files, Writable []string
	// Kubeconfig is the --kubeconfig flag's value: without one the process
	// needs the in-cluster configuration (the ServiceAccount's token).
	Kubeconfig *string
}

// reference is a Kubernetes dependent-variable reference the kubelet left as
// it was, because the container's environment has no such variable.
var reference = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// problems lists what keeps the process from starting, each naming the flag,
// the file or the variable and what to look at; none when it can start.
func (n needs) problems(set *flag.FlagSet) []string {
	var out []string
	unset := map[string]bool{}
	set.Visit(func(f *flag.Flag) {
		for _, m := range reference.FindAllStringSubmatch(f.Value.String(), -1) {
			if _, ok := os.LookupEnv(m[1]); ok {
				continue // a value that holds $(NAME) literally, on purpose
			}
			unset[f.Name] = true
			// The value itself is not repeated: the rest of it may be a
			// URL with credentials, and the answer goes to whoever asks.
			out = append(out, fmt.Sprintf("--%s refers to $(%s), and the environment has no %s (a key missing from the ConfigMap the container's envFrom names, or an env entry missing; a restart picks up the fix)",
				f.Name, m[1], m[1]))
		}
	})
	value := func(name string) string {
		f := set.Lookup(name)
		if f == nil || unset[name] {
			return ""
		}
		return f.Value.String()
	}
	for _, name := range n.Files {
		p := value(name)
		if p == "" {
			continue
		}
		f, err := os.Open(p)
		if err == nil {
			f.Close()
			continue
		}
		out = append(out, fmt.Sprintf("--%s %s cannot be read: %v (is the volume that holds it mounted there, and does its Secret have this key?)", name, p, cause(err)))
	}
	for _, name := range n.Writable {
		p := value(name)
		if p == "" {
			continue
		}
		if err := writable(p); err != nil {
			out = append(out, fmt.Sprintf("--%s %s is not writable: %v (mount a volume there, an emptyDir)", name, p, cause(err)))
		}
	}
	if n.Kubeconfig != nil && *n.Kubeconfig == "" && os.Getenv("KUBECONFIG") == "" {
		if _, err := rest.InClusterConfig(); err != nil {
			out = append(out, fmt.Sprintf("no way to the cluster: no --kubeconfig, no $KUBECONFIG, and the in-cluster configuration: %v (is the ServiceAccount token mounted?)", err))
		}
	}
	return out
}

// cause is err without the path an *fs.PathError repeats.
func cause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// writable makes dir if it is missing, as the catalog would, and checks
// that a file can be written in it.
func writable(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".agentboot-write-check-*")
	if err != nil {
		return err
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// settingsRecheck is how often files are looked at again while a process
// waits for them: the kubelet brings a changed Secret within about a
// minute.
const settingsRecheck = 5 * time.Second

// awaitSettings returns at once when check finds nothing. Otherwise it logs
// each problem, answers the probes at probeAddr (/healthz 200: the process
// is alive and a restart would not help a missing file; /readyz 503 with
// the problems) and checks again every interval, returning when nothing is
// left, with the probe address free again for the process's own probes.
func awaitSettings(ctx context.Context, log logr.Logger, probeAddr string, interval time.Duration, check func() []string) error {
	current := check()
	if len(current) == 0 {
		return nil
	}
	report := func(problems []string) {
		for _, p := range problems {
			log.Error(nil, "cannot start", "problem", p)
		}
		log.Info("waiting for the settings above; /readyz answers 503 with them", "recheck", interval.String())
	}
	report(current)
	var mu sync.Mutex
	if probeAddr != "" && probeAddr != "0" {
		l, err := net.Listen("tcp", probeAddr)
		if err != nil {
			return fmt.Errorf("%s; and the probe address: %w", strings.Join(current, "; "), err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			mu.Lock()
			msg := "not ready, waiting for settings:\n" + strings.Join(current, "\n")
			mu.Unlock()
			http.Error(w, msg, http.StatusServiceUnavailable)
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(l) }()
		defer func() { srv.Close(); <-done }()
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped while waiting for settings: %s", strings.Join(current, "; "))
		case <-tick.C:
		}
		next := check()
		if len(next) == 0 {
			log.Info("settings complete: starting")
			return nil
		}
		if !slices.Equal(next, current) {
			report(next)
		}
		mu.Lock()
		current = next
		mu.Unlock()
	}
}
