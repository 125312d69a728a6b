package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/internal/signing"
	"github.com/agentboot/agentboot/test/container"
	"github.com/agentboot/agentboot/test/testenv"
)

// binaries are agentboot's three processes run from an agentboot
// executable (Options.Binary), each as its ServiceAccount, with the flags
// deploy/ gives them, on the stack's addresses.
type binaries struct {
	s        *Stack
	ids      Identities
	dir      string
	certFile string
	keyFile  string
	keysDir  string
	catalog  []string // --os-image-stream or --os-images
	bootNS   string
	log      logr.Logger

	mu    sync.Mutex
	procs []*binaryProcess
}

type binaryProcess struct {
	name  string
	cmd   *exec.Cmd
	done  chan struct{}
	probe string
}

// kubeconfig writes cfg (a bearer token, the apiserver's CA) as a
// kubeconfig file, as a process outside the test reads it.
func kubeconfig(cfg *rest.Config, path string) error {
	ca := cfg.CAData
	if len(ca) == 0 && cfg.CAFile != "" {
		var err error
		if ca, err = os.ReadFile(cfg.CAFile); err != nil {
			return err
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: ca}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	return clientcmd.WriteToFile(*kc, path)
}

// start runs the three processes of binary and waits until each is ready.
func (b *binaries) start(binary string) error {
	ports, err := testenv.FreePorts(3)
	if err != nil {
		return err
	}
	s := b.s
	discovery := append([]string{
		"--image-cache-dir=" + s.ImageCache,
		"--agent-api-url=" + s.Settings.AgentAPIURL,
		"--image-service-url=" + s.Settings.ImageServiceURL,
		"--image-service-http-url=" + s.Settings.ImageServiceHTTPURL,
		"--ca-bundle-file=" + s.CAFile,
		"--agent-binary=" + s.AgentBin,
	}, b.catalog...)
	if s.Settings.ISOOverHTTP {
		discovery = append(discovery, "--iso-over-http")
	}
	common := func(name string, id *rest.Config, probe int) ([]string, error) {
		kc := filepath.Join(b.dir, name+".kubeconfig")
		if err := kubeconfig(id, kc); err != nil {
			return nil, err
		}
		return []string{"--kubeconfig=" + kc, "--namespace=" + Namespace, "--log-format=text",
			"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe)}, nil
	}
	type spec struct {
		name string
		id   *rest.Config
		args []string
	}
	specs := []spec{
		{"manager", b.ids.Manager, append([]string{"--agent-api-addr="}, discovery...)},
		{"image-service", b.ids.ImageService, append([]string{"--https-addr=" + s.HTTPSAddr, "--http-addr=" + s.HTTPAddr,
			"--tls-cert-file=" + b.certFile, "--tls-key-file=" + b.keyFile, "--boot-network-namespaces=" + b.bootNS}, discovery...)},
		{"agent-api", b.ids.AgentAPI, []string{"--agent-api-addr=" + s.AgentAPIAddr, "--agent-api-tls-cert-file=" + b.certFile,
			"--agent-api-tls-key-file=" + b.keyFile, "--keys-dir=" + b.keysDir}},
	}
	var procs []*binaryProcess
	for i, sp := range specs {
		flags, err := common(sp.name, sp.id, ports[i])
		if err != nil {
			return err
		}
		args := append(append([]string{sp.name}, flags...), sp.args...)
		cmd := exec.Command(binary, args...)
		cmd.Stdout = logWriter{b.log.WithName(sp.name)}
		cmd.Stderr = cmd.Stdout
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			b.stop()
			return fmt.Errorf("start %s %s: %w", binary, sp.name, err)
		}
		p := &binaryProcess{name: sp.name, cmd: cmd, done: make(chan struct{}), probe: fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[i])}
		go func() { _ = cmd.Wait(); close(p.done) }()
		// Known to stop at once, whatever fails next.
		b.mu.Lock()
		b.procs = append(b.procs, p)
		b.mu.Unlock()
		procs = append(procs, p)
	}
	for _, p := range procs {
		if err := p.awaitReady(2 * time.Minute); err != nil {
			return err
		}
	}
	return nil
}

func (p *binaryProcess) awaitReady(timeout time.Duration) error {
	c := &http.Client{Timeout: 2 * time.Second}
	last := "no answer"
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case <-p.done:
			return fmt.Errorf("%s ended before it was ready: %v", p.name, p.cmd.ProcessState)
		default:
		}
		resp, err := c.Get(p.probe)
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return fmt.Errorf("%s not ready after %s: /readyz %s", p.name, timeout, last)
}

// stop ends the processes as a kubelet does: SIGTERM, then SIGKILL after
// a grace period.
func (b *binaries) stop() {
	b.mu.Lock()
	procs := b.procs
	b.procs = nil
	b.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// logWriter sends a process's output, line by line, to a logger.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.log.Info(line)
	}
	return len(b), nil
}

// newBinaries prepares the stack's processes from opts.Binary; start runs
// them.
func (s *Stack) newBinaries(opts Options, ids Identities, dir, certFile, keyFile string, streams []string, log logr.Logger) (*binaries, error) {
	b := &binaries{s: s, ids: ids, dir: dir, certFile: certFile, keyFile: keyFile, bootNS: opts.BootNetworkNamespaces, log: log}
	for _, st := range streams {
		b.catalog = append(b.catalog, "--os-image-stream="+st)
	}
	if len(opts.Images) > 0 {
		raw, err := json.Marshal(opts.Images)
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, "os-images.json")
		if err := os.WriteFile(p, raw, 0o600); err != nil {
			return nil, err
		}
		b.catalog = append(b.catalog, "--os-images=@"+p)
	}
	b.keysDir = filepath.Join(dir, "agent-api-keys")
	if err := os.MkdirAll(b.keysDir, 0o700); err != nil {
		return nil, err
	}
	return b, nil
}

// mountKeys plays the kubelet for the agent API's keys volume until ctx
// ends.
func (b *binaries) mountKeys(ctx context.Context, c client.Reader) {
	container.MountSecret(ctx, c, client.ObjectKey{Namespace: Namespace, Name: signing.AgentAPISecretName}, b.keysDir, 0o400, -1, b.log)
}

// Upgrade replaces agentboot's processes with those of binary, as a
// rollout replaces pods with the new image: the CRDs and RBAC of deploy
// (a kustomize directory) are applied first, and the processes run as the
// ServiceAccounts anew. Only a stack started with Options.Binary can.
func (s *Stack) Upgrade(t testing.TB, binary, deploy string) {
	t.Helper()
	if s.upgrade == nil {
		t.Fatal("Stack.Upgrade: the stack was not started with Options.Binary")
	}
	if err := s.upgrade(binary, deploy); err != nil {
		t.Fatal(err)
	}
}

var errNoIdentities = errors.New("stack: Options.Binary runs the processes as deployed and needs Options.Identities")
