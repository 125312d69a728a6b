package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/agent"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/test/stack"
)

// proxy forwards TCP to the agent API and can be switched off and on, to
// play a service that restarts.
type proxy struct {
	target string
	mu     sync.Mutex
	l      net.Listener
	addr   string
	conns  []net.Conn
}

func (p *proxy) start(t *testing.T) {
	t.Helper()
	addr := p.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var l net.Listener
	var err error
	for i := 0; i < 50; i++ { // the old port may linger briefly
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, err)
	p.mu.Lock()
	p.l, p.addr = l, l.Addr().String()
	p.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

func (p *proxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.l.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// The agent registers this machine, reports its real inventory, rides out
// an outage of the service, and stops when its InfraEnv is deleted.
func TestAgentLifecycle(t *testing.T) {
	s := stack.Start(t, stack.Options{AgentPollInterval: time.Second, AgentLeaseRenewInterval: time.Second})
	ctx := context.Background()
	ie := stack.NewInfraEnv(s.Namespace(t, "agent"), "env")
	require.NoError(t, s.Client.Create(ctx, ie))
	ie = s.WaitImage(t, client.ObjectKeyFromObject(ie))

	p := &proxy{target: s.AgentAPIAddr}
	p.start(t)
	defer p.stop()
	cfg := s.AgentConfig(t, ie)
	cfg.APIURL = "https://" + p.addr
	path := filepath.Join(t.TempDir(), "agent.json")
	raw, _ := json.Marshal(cfg)
	require.NoError(t, os.WriteFile(path, raw, 0o600))

	acfg := agent.Config{ConfigPath: path, Version: "test", RetryMin: 100 * time.Millisecond, RetryMax: 500 * time.Millisecond,
		InventoryInterval: time.Second, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
		SessionPath: filepath.Join(t.TempDir(), "run", "session.json")}
	run := func() (chan error, context.CancelFunc) {
		a, err := agent.New(acfg)
		require.NoError(t, err)
		done := make(chan error, 1)
		runCtx, cancel := context.WithCancel(ctx)
		go func() { done <- a.Run(runCtx) }()
		return done, cancel
	}
	done, cancel := run()
	defer func() { cancel() }()

	agentOf := func() *v1beta1.Agent {
		var list v1beta1.AgentList
		require.NoError(t, s.Client.List(ctx, &list, client.InNamespace(ie.Namespace)))
		if len(list.Items) != 1 {
			return nil
		}
		return &list.Items[0]
	}
	var got *v1beta1.Agent
	require.Eventually(t, func() bool {
		got = agentOf()
		return got != nil && got.Status.Inventory.ReportTime != nil && got.Status.DebugInfo.State != ""
	}, 30*time.Second, 100*time.Millisecond)

	// The inventory is this machine's, as the agent binary prints it.
	mine, err := agent.Inventory(ctx, "/")
	require.NoError(t, err)
	inv := got.Status.Inventory
	require.Equal(t, mine.CPU.Count, inv.CPU.Count)
	require.Equal(t, mine.Memory.PhysicalBytes, inv.Memory.PhysicalBytes)
	require.Equal(t, len(mine.Disks), len(inv.Disks))
	require.Equal(t, mine.Virtualization.Verdict, inv.Virtualization.Verdict)
	require.Equal(t, mine.Virtualization.KVMUsable, inv.Virtualization.KVMUsable)

	// The service goes away and comes back: the host stays connected, in
	// the same session (registering again would be held off while it is
	// alive).
	session := lifecycle.Registration(agentOf()).Session
	require.NotEmpty(t, session)
	p.stop()
	time.Sleep(2 * time.Second)
	p.start(t)
	// renewed waits for a Lease renewal after the one it first sees.
	renewed := func(what string) {
		t.Helper()
		var lastRenew time.Time
		require.Eventually(t, func() bool {
			var l coordinationLease
			if !l.get(ctx, s, got) {
				return false
			}
			if lastRenew.IsZero() {
				lastRenew = l.renew
				return false
			}
			return l.renew.After(lastRenew)
		}, 30*time.Second, 200*time.Millisecond, what)
	}
	renewed("heartbeats resume after the outage")
	require.Equal(t, session, lifecycle.Registration(agentOf()).Session, "the agent kept its session through the outage")

	// The agent restarts in the same boot: it continues its session.
	cancel()
	<-done
	done, cancel = run()
	renewed("the restarted agent heartbeats")
	require.Equal(t, session, lifecycle.Registration(agentOf()).Session, "the restarted agent continued its session")

	// Deleting the InfraEnv stops the agent cleanly.
	require.NoError(t, s.Client.Delete(ctx, ie))
	select {
	case err := <-done:
		require.True(t, errors.Is(err, agent.ErrInfraEnvGone), "%v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the agent kept running after its InfraEnv was deleted")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

type coordinationLease struct{ renew time.Time }

func (l *coordinationLease) get(ctx context.Context, s *stack.Stack, a *v1beta1.Agent) bool {
	var lease coordinationv1.Lease
	if s.Client.Get(ctx, client.ObjectKey{Namespace: stack.Namespace, Name: "agent." + a.Namespace + "." + a.Name}, &lease) != nil || lease.Spec.RenewTime == nil {
		return false
	}
	l.renew = lease.Spec.RenewTime.Time
	return true
}
