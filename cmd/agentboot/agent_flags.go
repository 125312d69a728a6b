package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	agentservice "github.com/agentboot/agentboot/agent-service"
	"github.com/agentboot/agentboot/internal/agentwire"
)

// agentFlags are the agent API's and the Agent controller's settings.
type agentFlags struct {
	cfg         agentservice.Config
	minMemMiB   int64
	minDiskGB   int64
	minCPUCores int64
}

func (a *agentFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.cfg.Addr, "agent-api-addr", ":7443", "HTTPS listen address of the agent API")
	fs.StringVar(&a.cfg.TLSCertFile, "agent-api-tls-cert-file", "", "agent API serving certificate (PEM)")
	fs.StringVar(&a.cfg.TLSKeyFile, "agent-api-tls-key-file", "", "agent API serving key (PEM)")
	fs.Int64Var(&a.minCPUCores, "min-cpu-cores", agentwire.DefaultMinCPUCores, "fewest CPU cores a host needs, unless its InfraEnv's hostRequirements says otherwise")
	fs.Int64Var(&a.minMemMiB, "min-memory-mib", agentwire.DefaultMinMemoryBytes>>20, "least memory (MiB) a host needs, unless its InfraEnv's hostRequirements says otherwise")
	fs.Int64Var(&a.minDiskGB, "min-disk-size-gb", agentwire.DefaultMinDiskSizeBytes/1_000_000_000, "smallest installation disk (GB), unless its InfraEnv's hostRequirements says otherwise")
	fs.IntVar(&a.cfg.MaxAgentsPerInfraEnv, "max-agents-per-infraenv", agentservice.DefaultMaxAgentsPerInfraEnv, "most Agents the hosts of one InfraEnv may create; registrations past it are refused with 403 and an event on the InfraEnv")
	fs.IntVar(&a.cfg.MaxUnapprovedPerInfraEnv, "max-unapproved-agents-per-infraenv", agentservice.DefaultMaxUnapprovedPerInfraEnv, "most unapproved Agents one InfraEnv may have (an InfraEnv that approves automatically has none); registrations past it are refused with 403 until some are approved or deleted (-1: no cap)")
	fs.IntVar(&a.cfg.WriteBudgetPerInfraEnv, "agent-api-write-budget-per-infraenv", agentservice.DefaultWriteBudgetPerInfraEnv, "bytes per second the agent API may write to the apiserver for one InfraEnv's hosts, with a minute's worth at once; over it, 429 (-1: no limit; docs/security.md)")
	fs.IntVar(&a.cfg.WriteBudgetPerProcess, "agent-api-write-budget", agentservice.DefaultWriteBudgetPerProcess, "bytes per second the agent API of this replica may write to the apiserver in all, with a minute's worth at once (-1: no limit)")
	fs.IntVar(&a.cfg.WritesInFlight, "agent-api-writes-in-flight", agentservice.DefaultWritesInFlight, "registrations and inventory uploads the agent API serves at once; past it a host waits up to 250ms, then gets 429 with a Retry-After that spreads the refused at the rate they finish (-1: no bound; docs/agents.md#boot-storms)")
	fs.DurationVar(&a.cfg.PollInterval, "agent-poll-interval", 0, "how often hosts heartbeat (default "+agentwire.DefaultPollInterval.String()+")")
	fs.DurationVar(&a.cfg.DisconnectAfter, "agent-disconnect-after", 0, "how long a silent host stays Connected (default 3m)")
}

func (a *agentFlags) config() *agentservice.Config {
	c := a.cfg
	c.MinCPUCores, c.MinMemoryBytes, c.MinDiskSizeBytes = a.minCPUCores, a.minMemMiB<<20, a.minDiskGB*1_000_000_000
	return &c
}

// files are the flags naming files an agent API reads (its certificate).
func (a *agentFlags) files() []string {
	return []string{"agent-api-tls-cert-file", "agent-api-tls-key-file"}
}

// apiOnly are the flags only an agent API reads.
var apiOnly = []string{"agent-api-tls-cert-file", "agent-api-tls-key-file", "max-agents-per-infraenv",
	"max-unapproved-agents-per-infraenv", "agent-api-write-budget-per-infraenv", "agent-api-write-budget", "agent-api-writes-in-flight", "agent-poll-interval"}

// checkServed refuses agent API settings given to a process that serves no
// agent API (--agent-api-addr empty): they would be ignored without a word,
// and limits meant for the agent API would not hold where it runs.
func (a *agentFlags) checkServed(fs *flag.FlagSet) error {
	if a.cfg.Addr != "" {
		return nil
	}
	var set []string
	fs.Visit(func(f *flag.Flag) {
		if slices.Contains(apiOnly, f.Name) {
			set = append(set, "--"+f.Name)
		}
	})
	if len(set) > 0 {
		return fmt.Errorf("%s set, but --agent-api-addr is empty: this process serves no agent API; give them to agentboot agent-api", strings.Join(set, ", "))
	}
	return nil
}
