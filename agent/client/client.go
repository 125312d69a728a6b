// Package client speaks the agent API for the on-host agent: HTTPS with the
// CA and proxy from the agent's config, typed errors for the answers the
// agent acts on, and capped, jittered backoff.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/agentboot/agentboot/internal/agentwire"
)

// Client calls the agent API.
type Client struct {
	base  string
	http  *http.Client
	token string // per-agent token, after registration
}

// HTTP is a client with the service's CAs and proxy, for downloads the
// service points the agent at (the OS image). Unlike the API calls' client
// it has no limit on the whole exchange: a disk image of several GiB may
// take many minutes, and install ends a download that stalls.
func (c *Client) HTTP() *http.Client { return &http.Client{Transport: c.http.Transport} }

// New builds a client from the agent's config.
func New(cfg agentwire.Config) (*Client, error) {
	u, err := url.Parse(cfg.APIURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("agent API URL %q must be an https:// URL", cfg.APIURL)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if cfg.CABundle != "" && !pool.AppendCertsFromPEM([]byte(cfg.CABundle)) {
		return nil, errors.New("the CA bundle in the agent config holds no certificate")
	}
	proxy := http.ProxyFromEnvironment
	if p := cfg.Proxy; p != nil {
		pf := (&httpproxy.Config{HTTPProxy: p.HTTPProxy, HTTPSProxy: p.HTTPSProxy, NoProxy: p.NoProxy}).ProxyFunc()
		proxy = func(r *http.Request) (*url.URL, error) { return pf(r.URL) }
	}
	return &Client{
		base: strings.TrimSuffix(cfg.APIURL, "/"),
		http: &http.Client{
			Timeout: 60 * time.Second,
			Transport: &http.Transport{
				Proxy:                 proxy,
				TLSClientConfig:       &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
				TLSHandshakeTimeout:   10 * time.Second,
				ResponseHeaderTimeout: 30 * time.Second,
				IdleConnTimeout:       90 * time.Second,
			},
		},
	}, nil
}

// SetToken sets the per-agent token.
func (c *Client) SetToken(t string) { c.token = t }

// StatusError is an answer other than success.
type StatusError struct {
	Status int
	Code   string
	Msg    string
	// RetryAfter is when the service asked to be called again
	// (Retry-After, in seconds; 0 when it did not say).
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("agent API answered %d %s: %s", e.Status, e.Code, e.Msg)
	}
	return fmt.Sprintf("agent API answered %d: %s", e.Status, e.Msg)
}

// IsStatus reports whether err is an answer with HTTP status code.
func IsStatus(err error, code int) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Status == code
}

// IsCode reports whether err is an answer with the error code.
func IsCode(err error, code string) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == code
}

func (c *Client) do(ctx context.Context, method, path, bearer string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		se := &StatusError{Status: resp.StatusCode, RetryAfter: RetryAfter(resp.Header)}
		var e agentwire.Error
		if json.Unmarshal(raw, &e) == nil && e.Message != "" {
			se.Code, se.Msg = e.Code, e.Message
		} else {
			se.Msg = strings.TrimSpace(string(raw))
		}
		return se
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// maxRetryAfter is the longest Retry-After taken: past it, a misbehaving
// service would park the host for good.
const maxRetryAfter = 10 * time.Minute

// RetryAfter reads a Retry-After of delay-seconds (the agent API sends no
// dates); anything else is 0.
func RetryAfter(h http.Header) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	switch {
	case err != nil || n <= 0:
		return 0
	case n >= int(maxRetryAfter/time.Second):
		return maxRetryAfter // and no overflow of a huge n
	}
	return time.Duration(n) * time.Second
}

func fill(p string, kv ...string) string {
	for i := 0; i+1 < len(kv); i += 2 {
		p = strings.ReplaceAll(p, "{"+kv[i]+"}", url.PathEscape(kv[i+1]))
	}
	return p
}

// Register joins the InfraEnv with its registration token.
func (c *Client) Register(ctx context.Context, ie agentwire.InfraEnvRef, registrationToken string, req agentwire.RegisterRequest) (agentwire.RegisterResponse, error) {
	var resp agentwire.RegisterResponse
	err := c.do(ctx, http.MethodPost, fill(agentwire.RegisterPath, "namespace", ie.Namespace, "name", ie.Name), registrationToken, req, &resp)
	return resp, err
}

// PutInventory uploads the inventory.
func (c *Client) PutInventory(ctx context.Context, ns, id string, inv *agentwire.Inventory) error {
	return c.do(ctx, http.MethodPut, fill(agentwire.InventoryPath, "namespace", ns, "id", id), c.token, inv, nil)
}

// Instructions is the heartbeat.
func (c *Client) Instructions(ctx context.Context, ns, id string, req agentwire.InstructionsRequest) (agentwire.Instructions, error) {
	var out agentwire.Instructions
	err := c.do(ctx, http.MethodPost, fill(agentwire.InstructionsPath, "namespace", ns, "id", id), c.token, req, &out)
	return out, err
}

// StepResult reports a step's outcome.
func (c *Client) StepResult(ctx context.Context, ns, id, step string, r agentwire.StepResult) error {
	return c.do(ctx, http.MethodPost, fill(agentwire.StepResultPath, "namespace", ns, "id", id, "step", step), c.token, r, nil)
}

// Progress reports an installation stage.
func (c *Client) Progress(ctx context.Context, ns, id string, p agentwire.Progress) error {
	return c.do(ctx, http.MethodPost, fill(agentwire.ProgressPath, "namespace", ns, "id", id), c.token, p, nil)
}

// Backoff is capped exponential backoff with full jitter.
type Backoff struct {
	Min, Max time.Duration
	next     time.Duration
}

// Next returns how long to wait before the next attempt.
func (b *Backoff) Next() time.Duration {
	if b.next < b.Min {
		b.next = b.Min
	}
	d := b.next/2 + rand.N(b.next/2+1)
	b.next = min(b.next*2, b.Max)
	return d
}

// After returns how long to wait after err: the time the service asked for
// (Retry-After: a 429 Busy, a 503, a 409 HostActive until the earlier
// session has been silent long enough) with up to a second of jitter, since
// many hosts are given the same second; else the next backoff. A service that
// schedules the host's return is followed, not second-guessed: its turns
// spread a boot storm at the rate the apiserver takes writes.
func (b *Backoff) After(err error) time.Duration {
	var se *StatusError
	if errors.As(err, &se) && se.RetryAfter > 0 {
		return se.RetryAfter + rand.N(time.Second)
	}
	return b.Next()
}

// Reset starts over after a success.
func (b *Backoff) Reset() { b.next = 0 }

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
