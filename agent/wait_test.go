package agent

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentboot/agentboot/internal/agentwire"
)

// An agent API from before held heartbeats refuses waitSeconds as an
// unknown field (400): the agent then heartbeats without it, instead of
// failing every heartbeat.
func TestHeartbeatWithoutWaitForAnOlderService(t *testing.T) {
	var (
		mu     sync.Mutex
		waits  []int
		plains int
	)
	done := make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/hosts"):
			_ = json.NewEncoder(w).Encode(agentwire.RegisterResponse{Namespace: "ns", HostID: "00000000-0000-4000-8000-000000000001", AgentToken: "t", PollSeconds: 1})
		case strings.HasSuffix(r.URL.Path, "/inventory"):
		case strings.HasSuffix(r.URL.Path, "/instructions"):
			// The old service's decoder: unknown fields refused.
			dec := json.NewDecoder(r.Body)
			dec.DisallowUnknownFields()
			var req struct {
				Time       time.Time             `json:"time"`
				NTPSources []agentwire.NTPSource `json:"ntpSources,omitempty"`
			}
			mu.Lock()
			defer mu.Unlock()
			if err := dec.Decode(&req); err != nil {
				waits = append(waits, 1)
				http.Error(w, `{"code":"BadRequest","message":"json: unknown field \"waitSeconds\""}`, http.StatusBadRequest)
				return
			}
			plains++
			if plains == 2 {
				close(done)
			}
			_ = json.NewEncoder(w).Encode(agentwire.Instructions{Steps: []agentwire.Step{}, PollSeconds: 1})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	cfg, _ := json.Marshal(agentwire.Config{APIURL: srv.URL, InfraEnv: agentwire.InfraEnvRef{Namespace: "ns", Name: "ie", UID: "00000000-0000-4000-8000-0000000000ff"},
		RegistrationToken: "r", CABundle: string(ca)})
	path := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{ConfigPath: path, RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() { _ = a.Run(ctx) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the agent never heartbeat without waitSeconds")
	}
	cancel()
	mu.Lock()
	defer mu.Unlock()
	if len(waits) != 1 {
		t.Fatalf("%d heartbeats sent waitSeconds to a service that refused it; want only the first", len(waits))
	}
}
