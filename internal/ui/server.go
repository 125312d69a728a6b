package ui

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/scheme"
)

//go:embed static
var static embed.FS

// Server keeps the snapshot current from watches made with the viewer's
// credentials and serves the page.
type Server struct {
	// Config is the viewer's: every read is theirs.
	Config *rest.Config
	// Namespace, when set, is the only namespace watched; otherwise every
	// namespace the viewer may list, falling back to Fallback (the
	// kubeconfig context's) for a kind it may not list everywhere.
	Namespace, Fallback string
	// Home is agentboot's namespace, where unclaimed MACs' traces live.
	Home string
	// Token is the page's secret (default: random): the server holds the
	// viewer's credentials, and no one else on the machine may use them.
	Token string
	Log   logr.Logger

	mu      sync.Mutex
	snap    []byte
	version int
	changed chan struct{} // closed and replaced on each new snapshot
	ready   chan struct{}
}

// kinds are what the page reads.
var kinds = []struct {
	name string
	obj  client.Object
	list client.ObjectList
}{
	{"infraenvs.agent-install.openshift.io", &v1beta1.InfraEnv{}, &v1beta1.InfraEnvList{}},
	{"agents.agent-install.openshift.io", &v1beta1.Agent{}, &v1beta1.AgentList{}},
	{"baremetalhosts.metal3.io", &metal3.BareMetalHost{}, &metal3.BareMetalHostList{}},
	{"boottraces.agentboot.io", &v1alpha1.BootTrace{}, &v1alpha1.BootTraceList{}},
}

// URL is where the page is, with its token, for a listener at addr.
func (s *Server) URL(addr string) string { return "http://" + addr + "/?token=" + s.Token }

// Start watches until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	s.init()
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	direct, err := client.New(s.Config, client.Options{Scheme: sch})
	if err != nil {
		return err
	}
	// What the viewer may list, and where: as kubectl would be told.
	byObject := map[client.Object]cache.ByObject{}
	var errs []string
	var watched []client.Object
	scope := "every namespace"
	if s.Namespace != "" {
		scope = "namespace " + s.Namespace
	}
	for _, k := range kinds {
		ns := s.Namespace
		err := direct.List(ctx, k.list, client.InNamespace(ns), client.Limit(1))
		if apierrors.IsForbidden(err) && ns == "" && s.Fallback != "" {
			ns = s.Fallback
			err = direct.List(ctx, k.list, client.InNamespace(ns), client.Limit(1))
		}
		switch {
		case apierrors.IsForbidden(err):
			errs = append(errs, "Error from server (Forbidden): "+err.Error())
			continue
		case err != nil:
			return fmt.Errorf("list %s: %w", k.name, err)
		}
		if ns != "" {
			byObject[k.obj] = cache.ByObject{Namespaces: map[string]cache.Config{ns: {}}}
			if s.Namespace == "" {
				errs = append(errs, fmt.Sprintf("%s: you may not list them in every namespace; shown for namespace %s", k.name, ns))
			}
		}
		watched = append(watched, k.obj)
	}
	c, err := cache.New(s.Config, cache.Options{Scheme: sch, ByObject: byObject})
	if err != nil {
		return err
	}
	dirty := make(chan struct{}, 1)
	mark := func() {
		select {
		case dirty <- struct{}{}:
		default:
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{AddFunc: func(any) { mark() }, UpdateFunc: func(any, any) { mark() }, DeleteFunc: func(any) { mark() }}
	for _, obj := range watched {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	mark()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-dirty:
		}
		// Changes come in bursts (a host's status, its trace): one
		// snapshot for a burst.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
		o, err := read(ctx, c, watched)
		if err != nil {
			s.Log.Error(err, "read the cache")
			continue
		}
		raw, err := json.Marshal(Snapshot{Generated: time.Now().UTC(), Scope: scope, Errors: errs, Groups: build(o, s.Home)})
		if err != nil {
			return err
		}
		s.publish(raw)
	}
}

func (s *Server) init() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Token == "" {
		s.Token = rand.Text()
	}
	if s.changed == nil {
		s.changed, s.ready = make(chan struct{}), make(chan struct{})
	}
}

func (s *Server) publish(raw []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first := s.snap == nil
	s.snap = raw
	s.version++
	close(s.changed)
	s.changed = make(chan struct{})
	if first {
		close(s.ready)
	}
}

// current is the latest snapshot and a channel closed when a newer one
// is made.
func (s *Server) current() ([]byte, int, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap, s.version, s.changed
}

func read(ctx context.Context, c cache.Cache, watched []client.Object) (objects, error) {
	o := objects{infraEnvs: map[string]*v1beta1.InfraEnv{}, agents: map[string]*v1beta1.Agent{},
		hosts: map[string]*metal3.BareMetalHost{}, traces: map[string]*v1alpha1.BootTrace{}}
	for _, obj := range watched {
		switch obj.(type) {
		case *v1beta1.InfraEnv:
			var l v1beta1.InfraEnvList
			if err := c.List(ctx, &l); err != nil {
				return o, err
			}
			for i := range l.Items {
				o.infraEnvs[l.Items[i].Namespace+"/"+l.Items[i].Name] = &l.Items[i]
			}
		case *v1beta1.Agent:
			var l v1beta1.AgentList
			if err := c.List(ctx, &l); err != nil {
				return o, err
			}
			for i := range l.Items {
				o.agents[l.Items[i].Namespace+"/"+l.Items[i].Name] = &l.Items[i]
			}
		case *metal3.BareMetalHost:
			var l metal3.BareMetalHostList
			if err := c.List(ctx, &l); err != nil {
				return o, err
			}
			for i := range l.Items {
				o.hosts[l.Items[i].Namespace+"/"+l.Items[i].Name] = &l.Items[i]
			}
		case *v1alpha1.BootTrace:
			var l v1alpha1.BootTraceList
			if err := c.List(ctx, &l); err != nil {
				return o, err
			}
			for i := range l.Items {
				o.traces[l.Items[i].Namespace+"/"+l.Items[i].Name] = &l.Items[i]
			}
		}
	}
	return o, nil
}

// Handler serves the page, its snapshot and its stream of snapshots to
// whoever shows the token in each request's URL (the page passes it on:
// no cookie, which a browser would also send to any other service on the
// loopback host name), on a loopback host name only (a page elsewhere
// that resolves its name to 127.0.0.1 is refused).
func (s *Server) Handler() http.Handler {
	s.init()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		page, _ := static.ReadFile("static/index.html")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /snapshot.json", func(w http.ResponseWriter, r *http.Request) {
		raw, _, _ := s.wait(r.Context())
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(raw)
	})
	mux.HandleFunc("GET /events", s.serveEvents)
	return s.guard(mux)
}

func (s *Server) tokenOK(t string) bool {
	return subtle.ConstantTimeCompare([]byte(t), []byte(s.Token)) == 1
}

func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		if ip := net.ParseIP(host); !(host == "localhost" || ip != nil && ip.IsLoopback()) {
			http.Error(w, "forbidden: open the page at 127.0.0.1 or localhost", http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:")
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-store")
		if !s.tokenOK(r.URL.Query().Get("token")) {
			http.Error(w, "unauthorized: open the URL agentboot ui printed (it carries the page's token)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// wait returns the snapshot once there is one.
func (s *Server) wait(ctx context.Context) ([]byte, int, chan struct{}) {
	s.mu.Lock()
	ready := s.ready
	s.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
	}
	return s.current()
}

// serveEvents streams each snapshot as a server-sent event.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	sent := -1
	for {
		raw, version, changed := s.wait(r.Context())
		if r.Context().Err() != nil {
			return
		}
		if version != sent {
			if _, err := fmt.Fprintf(w, "data: %s\n\n", raw); err != nil {
				return
			}
			flusher.Flush()
			sent = version
		}
		select {
		case <-r.Context().Done():
			return
		case <-changed:
		case <-time.After(30 * time.Second):
			// A comment keeps proxies from closing an idle stream.
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flusher.Flush()
		}
	}
}
