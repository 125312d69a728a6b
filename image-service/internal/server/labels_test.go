package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Metric labels come from the route a request matched and from known file
// names only: made-up paths (every 404 an attacker sends) share one label.
func TestFileLabelFromRoutes(t *testing.T) {
	mux := http.NewServeMux()
	for _, p := range []string{routeImage, routeArtifact, routeBootMAC, routeBootGRUB, routeAgent, routeHealth} {
		mux.HandleFunc(p, func(http.ResponseWriter, *http.Request) {})
	}
	mux.HandleFunc("/", http.NotFound)
	for path, want := range map[string]string{
		"/images/uid/v1/discovery.iso":              "discovery.iso",
		"/images/uid/v1/initrd.img":                 "initrd.img",
		"/images/uid/v1/made-up-4f1c":               "unknown-file",
		"/boot-artifacts/x86_64/4.19/rootfs.img":    "rootfs.img",
		"/boot-artifacts/x86_64/4.19/../../etc/pwd": "other",
		"/boot.ipxe":      "boot.ipxe-by-mac",
		"/boot.grub":      "boot.grub-by-mac",
		"/agent/0123abcd": "agent",
		"/healthz":        "healthz",
		"/random/9a8b7c":  "other",
	} {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		mux.ServeHTTP(httptest.NewRecorder(), r)
		if got := fileLabel(r); got != want {
			t.Errorf("%s: label %q, want %q", path, got, want)
		}
	}
}
