package hostapi

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
)

// FuzzInventory feeds arbitrary bodies through the inventory upload's
// decoding and checks: they are accepted or refused, never a crash.
func FuzzInventory(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/inventory-*.json")
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"reportTime":"2026-01-01T00:00:00Z","disks":[{"id":""}]}`))
	f.Add([]byte(`{"cpu":{"count":-1}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPut, "/", bytes.NewReader(body))
		w := httptest.NewRecorder()
		var inv v1beta1.HostInventory
		if err := decode(w, r, agentwire.MaxInventoryBytes, &inv); err != nil {
			return
		}
		if validInventory(&inv) == nil {
			_ = sameInventory(inv, v1beta1.HostInventory{})
		}
	})
}

func TestHostInventoryIsValid(t *testing.T) {
	data, err := os.ReadFile("testdata/inventory-host.json")
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPut, "/", bytes.NewReader(data))
	var inv v1beta1.HostInventory
	if err := decode(httptest.NewRecorder(), r, agentwire.MaxInventoryBytes, &inv); err != nil {
		t.Fatal(err)
	}
	if err := validInventory(&inv); err != nil {
		t.Fatal(err)
	}
}
