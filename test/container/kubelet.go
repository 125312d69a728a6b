package container

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/test/netns"
	"github.com/agentboot/agentboot/test/testenv"
)

// NetnsPrefix names the network namespaces of the pods a Kubelet runs
// (<prefix><pid>-<pod>): a test calls netns.RemoveStale with it once, before
// its first pod, to delete those of runs that died (it deletes this
// process's too).
const NetnsPrefix = "abk"

// Kubelet runs the pods of Deployments from an OCI layout the way a
// kubelet and its container runtime run them, against a real apiserver: the
// image the pod template names, pulled by digest from the layout; the
// command, arguments and environment as the kubelet resolves them (envFrom
// ConfigMaps, fieldRefs, $(VAR) references, left as they are when
// undefined); Secret volumes with their defaultMode and the pod's fsGroup,
// emptyDirs, and the ServiceAccount's token, CA and namespace where
// in-cluster clients look; the user, groups, no_new_privs and read-only
// root of the security contexts; the memory limit, as a memory cgroup.
// Each pod has a network namespace of its own with an address on the
// node's bridge (Node), where probes and Services reach it, and on its
// loopback a forwarder stands in for the kubernetes Service (the
// apiserver) and for Forwards.
//
// What it does not do, and the manifests do not rely on: image volumes
// (the image's VOLUMEs are not mounted: what a container writes needs a
// volume in the manifest; containerd would make them), CPU limits,
// seccomp, probes acting by themselves (Pod.Probe asks), token rotation,
// more than one container or replica.
type Kubelet struct {
	// Env is the cluster; the kubelet reads Secrets and ConfigMaps and
	// asks for ServiceAccount tokens with its admin rights, as a node does.
	Env *testenv.Env
	// Layout is the OCI layout make image wrote; Arch is the node's.
	Layout, Arch string
	// Dir holds each pod's root file system, volumes and log.
	Dir string
	// Forwards are ports each pod reaches on its own loopback, forwarded
	// to addresses of this host (a mirror pods download from).
	Forwards map[int]string
	// Wait bounds how long a pod waits for the Secrets and ConfigMaps it
	// needs (a kubelet waits for ever).
	Wait time.Duration
	// Node is the node's network namespace: each pod gets an address of
	// its own on a bridge there (198.18.0.0/24), where probes come from
	// and Services forward to, so that a server bound to the pod's
	// loopback only is not reached, as on a real node.
	Node *netns.NS

	mu      sync.Mutex
	bridged bool
	pods    int
}

// Pod is one running pod of a Deployment.
type Pod struct {
	Name string
	NS   *netns.NS
	// IP is the pod's address on the node's bridge.
	IP   string
	node *netns.NS
	// memory limits the container (resources.limits.memory).
	memory    *memoryCgroup
	Container corev1.Container
	// Spec is the container as resolved, for Restart.
	Spec    Spec
	logPath string

	mu       sync.Mutex
	log      bytes.Buffer
	cmd      *process
	closers  []func()
	stopOnce sync.Once
}

// process is a started container process.
type process struct {
	started time.Time
	done    chan struct{}
	err     error
	stop    func()
}

// Start runs d's pod and stops it when t ends. It returns once the
// process has started; Ready says when it serves.
func (k *Kubelet) Start(t testing.TB, d *appsv1.Deployment) *Pod {
	t.Helper()
	p, err := k.start(t, d)
	if err != nil {
		t.Fatalf("pod of Deployment %s: %v", d.Name, err)
	}
	return p
}

func (k *Kubelet) start(t testing.TB, d *appsv1.Deployment) (*Pod, error) {
	ps := d.Spec.Template.Spec
	if len(ps.Containers) != 1 || len(ps.InitContainers) != 0 {
		return nil, fmt.Errorf("this kubelet runs pods of one container, not %d (and %d init containers)", len(ps.Containers), len(ps.InitContainers))
	}
	c := ps.Containers[0]
	img, err := k.pull(c.Image)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(k.Dir, d.Name)
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	if err := Unpack(img, root); err != nil {
		return nil, fmt.Errorf("unpack %s: %w", c.Image, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.wait())
	defer cancel()

	pod := &Pod{Name: d.Name, Container: c, logPath: filepath.Join(dir, "log")}
	t.Cleanup(pod.stop)
	if pod.NS, err = netns.New(fmt.Sprintf("%s%d-%s", NetnsPrefix, os.Getpid(), shortName(d.Name))); err != nil {
		return nil, err
	}
	pod.closers = append(pod.closers, pod.NS.Close)
	if err := k.attach(pod); err != nil {
		return nil, err
	}
	if limit, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		// A machine that cannot make memory cgroups (a container without
		// them delegated) runs the pod without its limit, and says so.
		if pod.memory, err = newMemoryCgroup(fmt.Sprintf("%s%d-%s", NetnsPrefix, os.Getpid(), shortName(d.Name)), limit.Value()); err != nil {
			t.Logf("pod %s: resources.limits.memory %s is not enforced on this machine: %v", d.Name, limit.String(), err)
			pod.memory = nil
		} else {
			pod.closers = append(pod.closers, pod.memory.remove)
		}
	}

	sc := effective(ps.SecurityContext, c.SecurityContext)
	uid, gid, err := user(root, cf.Config.User, sc)
	if err != nil {
		return nil, err
	}
	if sc.RunAsNonRoot != nil && *sc.RunAsNonRoot && uid == 0 {
		return nil, errors.New("container has runAsNonRoot and the image will run as root")
	}
	var groups []int
	fsGroup := -1
	if ps.SecurityContext != nil {
		if g := ps.SecurityContext.FSGroup; g != nil {
			fsGroup = int(*g)
			groups = append(groups, fsGroup)
		}
		for _, g := range ps.SecurityContext.SupplementalGroups {
			groups = append(groups, int(g))
		}
	}

	// Volumes.
	sources := map[string]string{}
	secretVolumes := map[string]bool{}
	for _, v := range ps.Volumes {
		p := filepath.Join(dir, "volumes", v.Name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
		switch {
		case v.EmptyDir != nil:
			if err := os.Chmod(p, 0o777); err != nil {
				return nil, err
			}
		case v.Secret != nil:
			secretVolumes[v.Name] = true
			mode := os.FileMode(0o644)
			if m := v.Secret.DefaultMode; m != nil {
				mode = os.FileMode(*m)
			}
			if len(v.Secret.Items) > 0 {
				return nil, fmt.Errorf("volume %s: this kubelet mounts whole Secrets, not items", v.Name)
			}
			key := client.ObjectKey{Namespace: d.Namespace, Name: v.Secret.SecretName}
			// The pod waits for a Secret that is not optional; an optional
			// one's volume is empty until it exists. Either is kept in
			// step with the Secret while the pod runs.
			if v.Secret.Optional == nil || !*v.Secret.Optional {
				if err := k.get(ctx, key, &corev1.Secret{}, "MountVolume.SetUp: Secret"); err != nil {
					return nil, fmt.Errorf("volume %s: %w", v.Name, err)
				}
			}
			sync, stopSync := context.WithCancel(context.Background())
			synced := make(chan struct{})
			go func() { defer close(synced); MountSecret(sync, k.Env.Client, key, p, mode, fsGroup, logr.Discard()) }()
			pod.closers = append(pod.closers, func() { stopSync(); <-synced })
			if v.Secret.Optional == nil || !*v.Secret.Optional {
				if err := awaitFile(ctx, filepath.Join(p, "..data")); err != nil {
					return nil, fmt.Errorf("volume %s: %w", v.Name, err)
				}
			}
		default:
			return nil, fmt.Errorf("volume %s: this kubelet mounts emptyDir and secret volumes only", v.Name)
		}
		sources[v.Name] = p
	}
	var mounts []Mount
	for _, m := range c.VolumeMounts {
		src, ok := sources[m.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %s names no volume of the pod", m.Name)
		}
		// A kubelet mounts Secret volumes read-only whatever the mount says.
		mounts = append(mounts, Mount{Source: src, Target: m.MountPath, ReadOnly: m.ReadOnly || secretVolumes[m.Name]})
	}
	apiserver, err := url.Parse(k.Env.Config.Host)
	if err != nil {
		return nil, fmt.Errorf("apiserver address %s: %w", k.Env.Config.Host, err)
	}
	host, port := apiserver.Hostname(), apiserver.Port()
	apiPort, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("apiserver address %s has no port", k.Env.Config.Host)
	}
	automount := ps.AutomountServiceAccountToken
	if automount == nil {
		// The ServiceAccount's own setting, when the pod has none.
		sa := ps.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		var account corev1.ServiceAccount
		if err := k.get(ctx, client.ObjectKey{Namespace: d.Namespace, Name: sa}, &account, "ServiceAccount"); err != nil {
			return nil, err
		}
		automount = account.AutomountServiceAccountToken
	}
	if automount == nil || *automount {
		p := filepath.Join(dir, "volumes", "kube-api-access")
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
		token, err := k.token(ctx, d.Namespace, ps.ServiceAccountName)
		if err != nil {
			return nil, err
		}
		ca := k.Env.Config.CAData
		if len(ca) == 0 && k.Env.Config.CAFile != "" {
			if ca, err = os.ReadFile(k.Env.Config.CAFile); err != nil {
				return nil, err
			}
		}
		if err := WriteSecretVolume(p, map[string][]byte{"token": []byte(token), "ca.crt": ca, "namespace": []byte(d.Namespace)}, 0o644, fsGroup); err != nil {
			return nil, err
		}
		mounts = append(mounts, Mount{Source: p, Target: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true})
	}

	// Environment: the kubernetes Service's, envFrom, env; $(VAR) sees
	// these only. The runtime puts the image's underneath afterwards.
	env := newEnvironment(nil)
	env.set("KUBERNETES_SERVICE_HOST", "127.0.0.1")
	env.set("KUBERNETES_SERVICE_PORT", port)
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			return nil, errors.New("envFrom: this kubelet reads ConfigMaps only")
		}
		var cm corev1.ConfigMap
		err := k.get(ctx, client.ObjectKey{Namespace: d.Namespace, Name: from.ConfigMapRef.Name}, &cm, "CreateContainerConfigError: ConfigMap")
		if err != nil && !(from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional && apierrors.IsNotFound(errors.Unwrap(err))) {
			return nil, fmt.Errorf("envFrom: %w", err)
		}
		for key, v := range cm.Data {
			env.set(from.Prefix+key, v)
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env.set(e.Name, expand(e.Value, env.lookup))
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.namespace":
				env.set(e.Name, d.Namespace)
			case "metadata.name":
				env.set(e.Name, d.Name+"-0")
			default:
				return nil, fmt.Errorf("env %s: fieldRef %s is not one this kubelet fills", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		default:
			return nil, fmt.Errorf("env %s: this kubelet fills values and fieldRefs only", e.Name)
		}
	}
	args := c.Command
	if len(args) == 0 {
		args = append(append([]string(nil), cf.Config.Entrypoint...), cf.Config.Cmd...)
		if len(c.Args) > 0 {
			args = append([]string(nil), cf.Config.Entrypoint...)
		}
	}
	args = append(args, c.Args...)
	for i := range args {
		args[i] = expand(args[i], env.lookup)
	}
	full := newEnvironment(cf.Config.Env)
	for _, kv := range env.list() {
		k, v, _ := strings.Cut(kv, "=")
		full.set(k, v)
	}
	workdir := c.WorkingDir
	if workdir == "" {
		workdir = cf.Config.WorkingDir
	}
	pod.Spec = Spec{
		Root: root, Args: args, Env: full.list(), Dir: workdir, UID: uid, GID: gid, Groups: groups,
		NoNewPrivs:   sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
		WritableRoot: sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem,
		Mounts:       mounts, NetNS: filepath.Join("/run/netns", pod.NS.Name),
	}

	// The kubernetes Service, and the forwards, on the pod's loopback.
	forwards := map[int]string{}
	for p, to := range k.Forwards {
		forwards[p] = to
	}
	forwards[apiPort] = net.JoinHostPort(host, port)
	for p, to := range forwards {
		l, err := pod.NS.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return nil, err
		}
		pod.closers = append(pod.closers, func() { l.Close() })
		go Forward(l, func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", to)
		})
	}
	return pod, pod.run()
}

// awaitFile waits until p exists.
func awaitFile(ctx context.Context, p string) error {
	for {
		if _, err := os.Lstat(p); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never appeared", p)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (k *Kubelet) wait() time.Duration {
	if k.Wait > 0 {
		return k.Wait
	}
	return 3 * time.Minute
}

// get reads an object a pod needs, waiting while it does not exist, as a
// kubelet does (the pod stays ContainerCreating); what names the wait.
func (k *Kubelet) get(ctx context.Context, key client.ObjectKey, obj client.Object, what string) error {
	for {
		err := k.Env.Client.Get(ctx, key, obj)
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s %s not found: %w", what, key, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// token is a ServiceAccount token from the TokenRequest API, as the
// kubelet's projected kube-api-access volume holds.
func (k *Kubelet) token(ctx context.Context, ns, sa string) (string, error) {
	if sa == "" {
		sa = "default"
	}
	cs, err := kubernetes.NewForConfig(k.Env.Config)
	if err != nil {
		return "", err
	}
	var tr *authenticationv1.TokenRequest
	for {
		ttl := int64(3600)
		tr, err = cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
		if err == nil {
			return tr.Status.Token, nil
		}
		if !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("token of ServiceAccount %s/%s: %w", ns, sa, err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("ServiceAccount %s/%s not found", ns, sa)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pull finds the image a pod template names, by digest, in the layout: an
// index (the platform's image is taken, as a runtime does) or an image.
func (k *Kubelet) pull(ref string) (v1.Image, error) {
	_, digest, ok := strings.Cut(ref, "@")
	if !ok {
		return nil, fmt.Errorf("image %q is not referenced by digest (deploy/kustomization.yaml's images entry, which make image sets)", ref)
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", ref, err)
	}
	return ImageByDigest(k.Layout, h, k.Arch)
}

// effective merges the pod's security context into the container's, as
// the kubelet does: the container's fields win.
func effective(pod *corev1.PodSecurityContext, c *corev1.SecurityContext) corev1.SecurityContext {
	var out corev1.SecurityContext
	if c != nil {
		out = *c.DeepCopy()
	}
	if pod != nil {
		if out.RunAsUser == nil {
			out.RunAsUser = pod.RunAsUser
		}
		if out.RunAsGroup == nil {
			out.RunAsGroup = pod.RunAsGroup
		}
		if out.RunAsNonRoot == nil {
			out.RunAsNonRoot = pod.RunAsNonRoot
		}
	}
	return out
}

// user is the uid and gid the container runs as: the security context's,
// else the image's USER; a uid without a gid takes its group from the
// image's /etc/passwd, as container runtimes do.
func user(root, imageUser string, sc corev1.SecurityContext) (uid, gid int, err error) {
	u, g, hasGroup := strings.Cut(imageUser, ":")
	if u != "" {
		if uid, err = strconv.Atoi(u); err != nil {
			return 0, 0, fmt.Errorf("image USER %q: this kubelet takes numeric users", imageUser)
		}
	}
	if hasGroup {
		if gid, err = strconv.Atoi(g); err != nil {
			return 0, 0, fmt.Errorf("image USER %q: this kubelet takes numeric groups", imageUser)
		}
	}
	if sc.RunAsUser != nil {
		uid = int(*sc.RunAsUser)
		hasGroup = false
	}
	if sc.RunAsGroup != nil {
		return uid, int(*sc.RunAsGroup), nil
	}
	if hasGroup {
		return uid, gid, nil
	}
	f, err := os.Open(filepath.Join(root, "etc", "passwd"))
	if err != nil {
		return uid, 0, nil
	}
	defer f.Close()
	sc2 := bufio.NewScanner(f)
	for sc2.Scan() {
		fields := strings.Split(sc2.Text(), ":")
		if len(fields) > 3 && fields[2] == strconv.Itoa(uid) {
			g, err := strconv.Atoi(fields[3])
			if err == nil {
				return uid, g, nil
			}
		}
	}
	return uid, 0, nil
}

// environment is an ordered environment in which later settings win.
type environment struct {
	names []string
	vals  map[string]string
}

func newEnvironment(image []string) *environment {
	e := &environment{vals: map[string]string{}}
	for _, kv := range image {
		k, v, _ := strings.Cut(kv, "=")
		e.set(k, v)
	}
	return e
}

func (e *environment) set(k, v string) {
	if _, ok := e.vals[k]; !ok {
		e.names = append(e.names, k)
	}
	e.vals[k] = v
}

func (e *environment) lookup(k string) (string, bool) { v, ok := e.vals[k]; return v, ok }

func (e *environment) list() []string {
	out := make([]string, 0, len(e.names))
	for _, k := range e.names {
		out = append(out, k+"="+e.vals[k])
	}
	return out
}

// expand resolves $(VAR) references as the kubelet does: a defined
// variable is replaced, an undefined reference stays as it is, $$ is $.
func expand(s string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '$' && i+1 < len(s) {
			switch s[i+1] {
			case '$':
				b.WriteByte('$')
				i++
				continue
			case '(':
				if j := strings.IndexByte(s[i+2:], ')'); j >= 0 {
					name := s[i+2 : i+2+j]
					if v, ok := lookup(name); ok {
						b.WriteString(v)
					} else {
						b.WriteString(s[i : i+3+j])
					}
					i += 2 + j
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// shortName keeps a network namespace's name short.
func shortName(s string) string {
	s = strings.TrimPrefix(s, "agentboot-")
	if len(s) > 16 {
		s = s[:16]
	}
	return s
}

// run starts the container's process; its output goes to the pod's log.
func (p *Pod) run() error {
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := io.MultiWriter(f, lockedWriter{&p.mu, &p.log})
	cmd, err := Command(ctx, p.Spec, w, w)
	if err != nil {
		cancel()
		f.Close()
		return err
	}
	// SIGTERM first, as a kubelet stops a container.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		f.Close()
		return err
	}
	if p.memory != nil {
		if err := p.memory.add(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			cancel()
			f.Close()
			return fmt.Errorf("memory cgroup: %w", err)
		}
	}
	e := &process{started: time.Now(), done: make(chan struct{})}
	e.stop = func() { cancel(); <-e.done }
	go func() {
		e.err = cmd.Wait()
		f.Close()
		close(e.done)
	}()
	p.mu.Lock()
	p.cmd = e
	p.mu.Unlock()
	return nil
}

// process is the container's current process.
func (p *Pod) process() *process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd
}

// Restart stops the container and starts it again in the same pod: the
// same volumes (an emptyDir keeps what it held), the same network.
func (p *Pod) Restart(t testing.TB) {
	t.Helper()
	e := p.process()
	e.stop()
	if err := p.run(); err != nil {
		t.Fatalf("restart %s: %v", p.Name, err)
	}
}

// Exited says whether the container's process ended, and how.
func (p *Pod) Exited() (bool, error) {
	e := p.process()
	select {
	case <-e.done:
		return true, e.err
	default:
		return false, nil
	}
}

// PeakMemory is the most memory the container used at once, in bytes (-1
// when it has no memory limit, or the kernel does not say).
func (p *Pod) PeakMemory() int64 {
	if p.memory == nil {
		return -1
	}
	return p.memory.peakBytes()
}

// Log is what the container wrote, across restarts.
func (p *Pod) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func (p *Pod) stop() {
	p.stopOnce.Do(func() {
		e := p.process()
		if e != nil {
			e.stop()
		}
		for i := len(p.closers) - 1; i >= 0; i-- {
			p.closers[i]()
		}
	})
}

// Port is the container port a Service's targetPort or a probe's port
// names.
func (p *Pod) Port(port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, cp := range p.Container.Ports {
		if cp.Name == port.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %s", p.Container.Name, port.StrVal)
}

// Dial connects to the pod's port from the node, at the pod's address.
func (p *Pod) Dial(ctx context.Context, port int) (net.Conn, error) {
	if p.node == nil {
		return p.NS.Dial(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	}
	return p.node.Dial(ctx, "tcp", net.JoinHostPort(p.IP, strconv.Itoa(port)))
}

// attach gives the pod an address on the node's bridge.
func (k *Kubelet) attach(p *Pod) error {
	if k.Node == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.bridged {
		for _, args := range [][]string{{"link", "add", "br0", "type", "bridge"}, {"addr", "add", "198.18.0.1/24", "dev", "br0"}, {"link", "set", "br0", "up"}} {
			if err := k.Node.IP(args...); err != nil {
				return err
			}
		}
		k.bridged = true
	}
	k.pods++
	if k.pods > 200 {
		return errors.New("this kubelet's bridge has addresses for 200 pods")
	}
	p.IP = fmt.Sprintf("198.18.0.%d", 10+k.pods)
	p.node = k.Node
	veth := fmt.Sprintf("veth%d", k.pods)
	for _, step := range []struct {
		ns   *netns.NS
		args []string
	}{
		{k.Node, []string{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", p.NS.Name}},
		{k.Node, []string{"link", "set", veth, "master", "br0", "up"}},
		{p.NS, []string{"addr", "add", p.IP + "/24", "dev", "eth0"}},
		{p.NS, []string{"link", "set", "eth0", "up"}},
		{p.NS, []string{"route", "add", "default", "via", "198.18.0.1"}},
	} {
		if err := step.ns.IP(step.args...); err != nil {
			return err
		}
	}
	return nil
}

// Probe sends an HTTP probe as the kubelet does: the status code and
// body, or the error that kept it from answering.
func (p *Pod) Probe(ctx context.Context, probe *corev1.Probe) (int, string, error) {
	if probe == nil || probe.HTTPGet == nil {
		return 0, "", errors.New("no HTTP probe")
	}
	port, err := p.Port(probe.HTTPGet.Port)
	if err != nil {
		return 0, "", err
	}
	// One connection a probe, as a kubelet's prober (no keep-alive).
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return p.Dial(ctx, port)
	}}}
	host := p.IP
	if host == "" {
		host = "127.0.0.1"
	}
	u := url.URL{Scheme: strings.ToLower(string(probe.HTTPGet.Scheme)), Host: net.JoinHostPort(host, strconv.Itoa(port)), Path: probe.HTTPGet.Path}
	if u.Scheme == "" {
		u.Scheme = "http"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(body), nil
}

// AwaitReady probes the pod's readiness until it answers 200, failing t
// with the last answer and the container's log if it does not in time or
// the container ends. It returns how long after its start the container
// was found ready (within 200ms).
func (p *Pod) AwaitReady(t testing.TB, timeout time.Duration) time.Duration {
	t.Helper()
	var code int
	var body string
	var err error
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if done, exitErr := p.Exited(); done {
			t.Fatalf("pod %s: the container ended (%v); its log:\n%s", p.Name, exitErr, tail(p.Log(), 40))
		}
		code, body, err = p.Probe(context.Background(), p.Container.ReadinessProbe)
		if err == nil && code == http.StatusOK {
			p.mu.Lock()
			defer p.mu.Unlock()
			return time.Since(p.cmd.started)
		}
	}
	t.Fatalf("pod %s not ready after %s: probe %d %q (%v); its log:\n%s", p.Name, timeout, code, body, err, tail(p.Log(), 40))
	return 0
}

// LogTail is the last n lines of the container's log.
func (p *Pod) LogTail(n int) string { return tail(p.Log(), n) }

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Expose plays a LoadBalancer Service: in lb, each of the Service's ports
// listens on 127.0.0.1 and forwards to the pod's target port.
func (p *Pod) Expose(t testing.TB, lb *netns.NS, svc *corev1.Service) {
	t.Helper()
	for _, sp := range svc.Spec.Ports {
		target := sp.TargetPort
		if target.Type == intstr.Int && target.IntVal == 0 {
			target = intstr.FromInt32(sp.Port)
		}
		port, err := p.Port(target)
		if err != nil {
			t.Fatalf("Service %s: %v", svc.Name, err)
		}
		l, err := lb.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", sp.Port))
		if err != nil {
			t.Fatalf("Service %s port %d: %v", svc.Name, sp.Port, err)
		}
		t.Cleanup(func() { l.Close() })
		go Forward(l, func(ctx context.Context) (net.Conn, error) { return p.Dial(ctx, port) })
	}
}

// Forward joins each connection l accepts to one dial makes, until l is
// closed.
func Forward(l net.Listener, dial func(context.Context) (net.Conn, error)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			up, err := dial(ctx)
			cancel()
			if err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			join := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go join(up, c)
			go join(c, up)
			<-done
			<-done
		}()
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
