package agentservice_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentclient "github.com/agentboot/agentboot/agent/client"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/test/stack"
)

// A boot storm larger than the agent API serves at once (here one
// registration at a time): the hosts it cannot serve within a moment get
// 429 Busy with a Retry-After, come back then as the agent does, and every
// one registers. None is refused for good, none is lost.
func TestBootStormServedInTurns(t *testing.T) {
	b := stack.Start(t, stack.Options{WritesInFlight: 1})
	ie := b.CreateInfraEnv(t, "storm", "pool", nil)
	cfg := b.AgentConfig(t, ie)
	ctx := context.Background()
	const hosts = 100
	var (
		mu    sync.Mutex
		busy  int
		turns []time.Duration
	)
	errs := make(chan error, hosts)
	start := make(chan struct{})
	for i := range hosts {
		c, err := agentclient.New(cfg)
		require.NoError(t, err)
		go func() {
			<-start
			backoff := agentclient.Backoff{Min: time.Second, Max: 10 * time.Second}
			req := agentwire.RegisterRequest{InfraEnvUID: cfg.InfraEnv.UID, HostID: stack.HostID(i + 1),
				Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(i + 1)}}}
			for deadline := time.Now().Add(3 * time.Minute); ; {
				_, err := c.Register(ctx, cfg.InfraEnv, cfg.RegistrationToken, req)
				var se *agentclient.StatusError
				switch {
				case err == nil:
					errs <- nil
					return
				case !errors.As(err, &se) || se.Code != "Busy" || se.Status != 429:
					errs <- err
					return
				case time.Now().After(deadline):
					errs <- err
					return
				}
				mu.Lock()
				busy++
				turns = append(turns, se.RetryAfter)
				mu.Unlock()
				if agentclient.Sleep(ctx, backoff.After(err)) != nil {
					errs <- err
					return
				}
			}
		}()
	}
	close(start)
	for range hosts {
		require.NoError(t, <-errs)
	}
	var agents v1beta1.AgentList
	require.NoError(t, b.Client.List(ctx, &agents, client.InNamespace(ie.Namespace)))
	require.Len(t, agents.Items, hosts, "every host registered, once")
	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, busy, "100 hosts at once against one slot: some were told to come back")
	t.Logf("%d refusals; Retry-After from %s to %s", busy, turns[0], turns[len(turns)-1])
}
