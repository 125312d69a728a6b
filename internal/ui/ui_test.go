package ui_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/agentboot/agentboot/internal/ui"
	"github.com/agentboot/agentboot/test/stack"
)

func TestMain(m *testing.M) { stack.Main(m) }

// serve runs the page for cfg until the test ends and returns its URL.
func serve(t *testing.T, cfg *rest.Config, fallback string) (*ui.Server, string) {
	t.Helper()
	srv := &ui.Server{Config: cfg, Fallback: fallback, Home: stack.Namespace, Log: testr.New(t)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() {
		cancel()
		hs.Close()
		require.NoError(t, <-done)
	})
	return srv, srv.URL(l.Addr().String())
}

// browser starts Debian's headless Chromium, driven by chromedp; a failed
// test keeps a screenshot of what the page showed.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: install Debian's chromium package (.ci/packages; hack/prereqs.sh as root)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1400, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "start chromium")
	t.Cleanup(func() {
		if t.Failed() {
			shot, stop := context.WithTimeout(ctx, 10*time.Second)
			if png, err := chromedp.Run(shot, chromedp.FullScreenshot(90)); err == nil {
				name := filepath.Join(os.TempDir(), "agentboot-"+strings.ReplaceAll(t.Name(), "/", "-")+".png")
				if os.WriteFile(name, png, 0o644) == nil {
					t.Logf("screenshot of the page: %s", name)
				}
			}
			stop()
		}
		cancel()
		cancelAlloc()
	})
	return ctx
}

// text waits until the element sel shows want.
func text(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	var got string
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); <-tick.C {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		got, err = chromedp.Run(c, chromedp.Text(chromedp.CSS(sel)))
		cancel()
		if err == nil && strings.Contains(got, want) {
			return
		}
	}
	t.Fatalf("%s never showed %q; it showed %q", sel, want, got)
}

// A person opens the page: the InfraEnv is there with no hosts; a host
// registers and its row appears, discovering; its inventory arrives and
// the row turns known, waiting for approval, without a reload. The page
// opens only with its token, and on a loopback name.
func TestPageShowsHostsLive(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ie := s.CreateInfraEnv(t, "team", "pool", nil)
	_, url := serve(t, s.Env.Config, "")
	ctx := browser(t)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url)))
	group := `section[data-group="` + ie.Namespace + `/` + ie.Name + `"]`
	text(t, ctx, group, "no hosts")
	text(t, ctx, "#meta", "Watching every namespace with your credentials")
	first, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`window.agentbootFirstRender`))
	require.NoError(t, err)
	t.Logf("time to first render: %.0f ms", first)

	h := s.RegisterOnly(t, ie, 1)
	row := `tr[data-host="agent/` + h.NS + `/` + h.ID + `"]`
	text(t, ctx, row+` [data-state]`, "discovering")
	require.NoError(t, h.PutInventory(stack.FakeInventory("host-1", stack.MAC(1))))
	text(t, ctx, row+` [data-state]`, "unapproved")
	text(t, ctx, row+` [data-agent-state]`, "known")
	text(t, ctx, row, "host-1")
	text(t, ctx, row, "4 CPUs")
	text(t, ctx, group+" .counts", "unapproved: 1")

	// A click shows the host's boot path.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(row))))
	text(t, ctx, `tr[data-details="agent/`+h.NS+`/`+h.ID+`"]`, "registered through InfraEnv pool")

	// Without the token, or at a name that is not loopback: refused.
	var resp *http.Response
	for _, req := range []*http.Request{mustRequest(t, strings.Split(url, "?")[0], ""), mustRequest(t, strings.Split(url, "?")[0]+"events", "")} {
		resp, err = http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, req.URL.String())
	}
	// A wrong token opens nothing, on any path; the right one sets no
	// cookie (a browser would send it to other loopback services too).
	base := strings.Split(url, "?")[0]
	for _, u := range []string{base + "?token=wrong", base + "snapshot.json?token=wrong", base + "events?token=x", base + "snapshot.json"} {
		resp, err = http.DefaultClient.Do(mustRequest(t, u, ""))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, u)
	}
	resp, err = http.DefaultClient.Do(mustRequest(t, url, ""))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, resp.Cookies())
	resp, err = http.DefaultClient.Do(mustRequest(t, url, "attacker.example"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a page of another site rebinding its name to 127.0.0.1")
}

func mustRequest(t *testing.T, url, host string) *http.Request {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	return req
}

// Someone who may read nothing sees what the apiserver said, as kubectl
// would show it, and no host.
func TestPageRefusesWithoutRights(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ie := s.CreateInfraEnv(t, "team", "pool", nil)
	s.RegisterOnly(t, ie, 2)
	kubeconfig, err := s.Env.UserKubeconfig("nobody-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
	require.NoError(t, err)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	_, url := serve(t, cfg, ie.Namespace)
	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url)))
	text(t, ctx, "#forbidden", `Error from server (Forbidden): agents.agent-install.openshift.io is forbidden: User "nobody`)
	text(t, ctx, "#forbidden", `cannot list resource "agents" in API group "agent-install.openshift.io" in the namespace "`+ie.Namespace+`"`)
	groups, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("section").length`))
	require.NoError(t, err)
	require.Zero(t, groups, "nothing it may not read is shown")
}
