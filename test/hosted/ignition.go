package hosted

import (
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/test/stack"
)

// WorkerMarker is what the worker config, fetched through the pointer
// config, prints on the console of the host that applied it.
const WorkerMarker = "agentboot-test: worker config applied"

// Token is the bearer token the Ignition endpoint wants, and NodePoolHeader
// the NodePool header value the pointer config sends.
const (
	Token          = "bm9kZXBvb2wtdG9rZW4"
	NodePoolHeader = "clusters/vcluster2"
	// WantRequest is what Seen records for a request with both.
	WantRequest = "/ignition Bearer " + Token + " " + NodePoolHeader
)

// Endpoint plays a hosted cluster's Ignition endpoint: HTTPS with its own
// CA, answering only requests with the bearer token.
type Endpoint struct {
	// Pointer is the pointer config HyperShift would put in the NodePool's
	// user-data Secret.
	Pointer []byte
	// Addr is host:port hosts reach it at, CA the PEM CA of its certificate.
	Addr string
	CA   []byte
	mu   sync.Mutex
	seen []string
}

// Seen lists "path authorization nodepool-header" of every request.
func (e *Endpoint) Seen() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.seen...)
}

// IgnitionEndpoint serves on ln, which hosts reach as host.
func IgnitionEndpoint(t testing.TB, ln net.Listener, host string) *Endpoint {
	t.Helper()
	certFile, keyFile, caPEM, err := stack.Certificates(t.TempDir(), host)
	require.NoError(t, err)
	worker := IgnitionConfig(t, map[string]any{
		"storage": map[string]any{"files": []any{map[string]any{
			"path": "/usr/local/bin/joined", "mode": 0o755,
			"contents": map[string]any{"source": "data:;base64," + base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\necho "+WorkerMarker+" > /dev/console\n"))},
		}}},
		"systemd": map[string]any{"units": []any{map[string]any{
			"name": "joined.service", "enabled": true,
			"contents": "[Service]\nExecStart=/usr/local/bin/joined\n[Install]\nWantedBy=multi-user.target\n",
		}}},
	})
	e := &Endpoint{Addr: fmt.Sprintf("%s:%d", host, ln.Addr().(*net.TCPAddr).Port), CA: caPEM}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.seen = append(e.seen, r.URL.Path+" "+r.Header.Get("Authorization")+" "+r.Header.Get("NodePool"))
		e.mu.Unlock()
		if r.URL.Path != "/ignition" || r.Header.Get("Authorization") != "Bearer "+Token {
			http.Error(w, "wrong token", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write(worker)
	})}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	go func() { _ = srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})) }()
	t.Cleanup(func() { srv.Close() })
	e.Pointer = IgnitionConfig(t, map[string]any{
		"ignition": map[string]any{
			"version": "3.4.0",
			"config": map[string]any{"merge": []any{map[string]any{
				"source": fmt.Sprintf("https://%s:%d/ignition", host, ln.Addr().(*net.TCPAddr).Port),
				"httpHeaders": []any{
					map[string]any{"name": "Authorization", "value": "Bearer " + Token},
					map[string]any{"name": "NodePool", "value": NodePoolHeader},
				},
			}}},
			"security": map[string]any{"tls": map[string]any{"certificateAuthorities": []any{
				map[string]any{"source": "data:;base64," + base64.StdEncoding.EncodeToString(caPEM)},
			}}},
		},
	})
	return e
}

// IgnitionConfig is c as JSON, with ignition.version 3.4.0 unless c has
// its own ignition section.
func IgnitionConfig(t testing.TB, c map[string]any) []byte {
	t.Helper()
	if _, ok := c["ignition"]; !ok {
		c["ignition"] = map[string]any{"version": "3.4.0"}
	}
	data, err := json.Marshal(c)
	require.NoError(t, err)
	return data
}
