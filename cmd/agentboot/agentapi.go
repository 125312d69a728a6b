package main

import (
	"context"
	"flag"

	"github.com/agentboot/agentboot/cmd/agentboot/app"
)

// runAgentAPI serves the agent API on its own, as deployed
// (deploy/agent-api.yaml): under an identity that reads no Secret, with
// its keys from the files the kubelet mounts and bound hosts'
// installations from what the manager hands over (docs/security.md).
func runAgentAPI(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("agent-api", flag.ContinueOnError)
	var (
		m       managerFlags
		ag      agentFlags
		keysDir = fs.String("keys-dir", "/etc/agentboot/keys", "directory the agent API's keys are mounted in (Secret agentboot-agent-api-keys, which the manager writes)")
		c       clusterFlags
	)
	c.register(fs)
	m.registerProcess(fs, ":8445", ":8083")
	ag.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Its keys are not among the needs: the manager writes them, and until
	// they are mounted the process runs unready (the "keys" check).
	log, cfg, err := c.start(ctx, fs, needs{Files: ag.files()}, m.probeAddr)
	if err != nil {
		return err
	}
	// Every replica serves; none leads.
	mgr, err := app.NewManager(cfg, m.options(), log)
	if err != nil {
		return err
	}
	if err := app.Add(mgr, app.Components{Namespace: m.namespace, AgentService: ag.config(), AgentAPIKeysDir: *keysDir}, log); err != nil {
		return err
	}
	log.Info("starting agent API", "version", version, "namespace", m.namespace)
	return mgr.Start(ctx)
}
