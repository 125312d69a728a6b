package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/agentboot/agentboot/agentclassification"
	"github.com/agentboot/agentboot/bmc"
	"github.com/agentboot/agentboot/cmd/agentboot/app"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/sanitize"
	"github.com/agentboot/agentboot/nodepool"
)

// managerFlags are the settings of the manager, whether it runs alone
// (`agentboot manager`) or inside `agentboot dev`.
type managerFlags struct {
	namespace     string
	leaderElect   bool
	metricsAddr   string
	metricsSecure bool
	probeAddr     string
	nodePools     bool
	approveCSRs   bool
	bmcNetworks   string
	behindNAT     bool
	softPowerOff  time.Duration
	powerTimeout  time.Duration
	// agentClassifications runs the AgentClassification controllers, their
	// queries in a worker process of classificationMemory MiB.
	agentClassifications bool
	classificationMemory int64
	// sanitization and the flags it was made from.
	sanitization     sanitize.Policy
	infraEnvSanitize []string
}

func (m *managerFlags) register(fs *flag.FlagSet) {
	m.registerProcess(fs, ":8443", ":8081")
	fs.BoolVar(&m.leaderElect, "leader-elect", true, "elect a leader among manager replicas before running controllers (an agent API served in-process runs on every replica)")
	fs.BoolVar(&m.nodePools, "nodepools", true, "install the Agents cluster-api-provider-agent binds for HyperShift NodePools and explain NodePool shortfalls; false hands out no installation (another service installs them)")
	fs.BoolVar(&m.approveCSRs, "approve-kubelet-csrs", true, "approve the kubelet CSRs of hosts agentboot installed, after checking them as cluster-machine-approver does; false leaves every one to a person, with an event naming it")
	fs.BoolVar(&m.agentClassifications, "agent-classifications", true, "label Agents by AgentClassifications' queries over their inventory; each query runs in a worker process whose memory the kernel caps (docs/agents.md)")
	fs.Int64Var(&m.classificationMemory, "agent-classification-memory", agentclassification.DefaultWorkerMemory>>20, "MiB of address space the AgentClassification query worker may use beyond its own start; a query that needs more fails on that Agent (the worker runs in the manager's container, inside its memory limit)")
	fs.BoolVar(&m.behindNAT, "agent-api-behind-nat", false, "the agent API does not see hosts' own source addresses (SNAT or a proxy in front of it): kubelet serving CSRs are checked against the addresses hosts report instead of those they were seen using")
	fs.StringVar(&m.bmcNetworks, "bmc-networks", "", "comma-separated CIDRs BareMetalHost BMC addresses must be in (names are resolved and every address checked); empty: any. "+
		"Set it where tenants declare BareMetalHosts, so that none can make the manager connect, with credentials, to services on other networks")
	fs.DurationVar(&m.softPowerOff, "bmc-soft-power-off-timeout", 3*time.Minute, "how long a host's OS gets to shut down after a BMC graceful shutdown request before its power is cut")
	fs.DurationVar(&m.powerTimeout, "bmc-power-timeout", time.Minute, "how long a BMC may take to report a power state it accepted a request for before the request is sent again (three times, then an error)")
	m.sanitization = sanitize.DefaultPolicy
	fs.Func("disk-sanitization", "what a host released from a cluster erases before it can be bound again: none, metadata or erase (default erase; docs/security.md)", func(v string) error {
		l, err := sanitize.ParseLevel(v)
		m.sanitization.Default = l
		return err
	})
	fs.Func("disk-sanitization-infraenv", "namespace/infraenv=level: the level for one InfraEnv's hosts (repeat for more)", func(v string) error {
		levels, err := sanitize.ParseInfraEnvLevels(append(m.infraEnvSanitize, v))
		if err == nil {
			m.infraEnvSanitize, m.sanitization.PerInfraEnv = append(m.infraEnvSanitize, v), levels
		}
		return err
	})
}

// registerProcess registers the settings every agentboot server process
// has: its namespace, metrics and probes.
func (m *managerFlags) registerProcess(fs *flag.FlagSet, metrics, probes string) {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "agentboot-system"
	}
	fs.StringVar(&m.namespace, "namespace", ns, "namespace for agentboot's own objects (signing key, leader lease); defaults to $POD_NAMESPACE")
	fs.StringVar(&m.metricsAddr, "metrics-bind-address", metrics, "address of the Prometheus metrics endpoint; 0 disables it")
	fs.BoolVar(&m.metricsSecure, "metrics-secure", true, "serve metrics over HTTPS with Kubernetes authentication and authorization")
	fs.StringVar(&m.probeAddr, "health-probe-bind-address", probes, "address of the /healthz and /readyz endpoints")
}

// bmc is the BareMetalHost controller's configuration from the flags.
func (m managerFlags) bmc() (bmc.Config, error) {
	cfg := bmc.Config{SoftPowerOffTimeout: m.softPowerOff, PowerTimeout: m.powerTimeout}
	if m.softPowerOff <= 0 || m.powerTimeout <= 0 {
		return cfg, fmt.Errorf("--bmc-soft-power-off-timeout and --bmc-power-timeout must be positive")
	}
	for _, s := range strings.Split(m.bmcNetworks, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return cfg, fmt.Errorf("--bmc-networks: %q is not a CIDR: %w", s, err)
		}
		cfg.Networks = append(cfg.Networks, p.Masked())
	}
	return cfg, nil
}

// classificationSandbox runs AgentClassification queries in this
// executable's classify-worker, capped at --agent-classification-memory.
func (m managerFlags) classificationSandbox() agentclassification.Matcher {
	return &agentclassification.Sandbox{Memory: m.classificationMemory << 20, Command: func() *exec.Cmd {
		self, err := os.Executable()
		if err != nil {
			self = os.Args[0]
		}
		return exec.Command(self, "classify-worker", "--memory-mib", strconv.FormatInt(m.classificationMemory, 10))
	}}
}

func (m managerFlags) nodePool() nodepool.Config {
	return nodepool.Config{Off: !m.nodePools, NoCSRApproval: !m.approveCSRs, AgentAPIBehindNAT: m.behindNAT, Sanitization: m.sanitization}
}

func (m managerFlags) options() app.ManagerOptions {
	return app.ManagerOptions{Namespace: m.namespace, LeaderElect: m.leaderElect, MetricsAddr: m.metricsAddr, MetricsSecure: m.metricsSecure, ProbeAddr: m.probeAddr}
}

// clusterFlags are the settings of every process that talks to a cluster:
// where it is and how to log.
type clusterFlags struct {
	kubeconfig, logLevel, logFormat string
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig to use; defaults to $KUBECONFIG or the in-cluster configuration")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "json", "text or json")
}

// start sets up logging, waits until what the flags name is there
// (awaitSettings, answering the probes at probeAddr meanwhile) and loads
// the cluster's configuration.
func (c *clusterFlags) start(ctx context.Context, set *flag.FlagSet, n needs, probeAddr string) (logr.Logger, *rest.Config, error) {
	log, err := newLogger(os.Stderr, c.logLevel, c.logFormat)
	if err != nil {
		return log, nil, err
	}
	n.Kubeconfig = &c.kubeconfig
	if err := awaitSettings(ctx, log, probeAddr, settingsRecheck, func() []string { return n.problems(set) }); err != nil {
		return log, nil, err
	}
	cfg, err := restConfig(c.kubeconfig)
	return log, cfg, err
}

// restConfig loads the kubeconfig at path, or $KUBECONFIG, or the in-cluster
// configuration.
func restConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return cfg, nil
}

func runManager(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	var (
		m  managerFlags
		d  discoveryFlags
		ag agentFlags
		c  clusterFlags
	)
	c.register(fs)
	m.register(fs)
	d.register(fs)
	ag.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := ag.checkServed(fs); err != nil {
		return err
	}
	log, cfg, err := c.start(ctx, fs, needs{Files: append(d.files(), ag.files()...), Writable: d.writable()}, m.probeAddr)
	if err != nil {
		return err
	}
	settings, err := d.settings()
	if err != nil {
		return err
	}
	catalog, err := newCatalog(d, log)
	if err != nil {
		return err
	}
	mgr, err := app.NewManager(cfg, m.options(), log)
	if err != nil {
		return err
	}
	bmcCfg, err := m.bmc()
	if err != nil {
		return err
	}
	if err := app.Add(mgr, app.Components{Namespace: m.namespace, Catalog: catalog, Settings: settings, Controllers: true, AgentService: ag.config(), NodePool: m.nodePool(), BMC: bmcCfg, AgentClassifications: m.agentClassifications, ClassificationMatcher: m.classificationSandbox()}, log); err != nil {
		return err
	}
	log.Info("starting manager", "version", version, "namespace", m.namespace)
	return mgr.Start(ctx)
}

// newCatalog builds the OS image catalog from the flags.
func newCatalog(d discoveryFlags, log logr.Logger) (*osimage.Catalog, error) {
	cfg, err := d.catalogConfig(log)
	if err != nil {
		return nil, err
	}
	return osimage.New(cfg)
}
