package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/vincent-petithory/dataurl"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
)

// AgentConfig is the agent config a host of ie gets, read out of the
// discovery Ignition the image service serves, with the agent API URL
// pointed at the loopback listener.
func (s *Stack) AgentConfig(t testing.TB, ie *v1beta1.InfraEnv) agentwire.Config {
	t.Helper()
	resp, err := s.HTTP.Get(s.Local(ie.Status.BootArtifacts.DiscoveryIgnitionURL))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("discovery Ignition: %s: %s", resp.Status, raw)
	}
	var ign struct {
		Storage struct {
			Files []struct {
				Path     string `json:"path"`
				Contents struct {
					Source string `json:"source"`
				} `json:"contents"`
			} `json:"files"`
		} `json:"storage"`
	}
	if err := json.Unmarshal(raw, &ign); err != nil {
		t.Fatal(err)
	}
	for _, f := range ign.Storage.Files {
		if f.Path != agentwire.ConfigPath {
			continue
		}
		du, err := dataurl.DecodeString(f.Contents.Source)
		if err != nil {
			t.Fatal(err)
		}
		var cfg agentwire.Config
		if err := json.Unmarshal(du.Data, &cfg); err != nil {
			t.Fatal(err)
		}
		cfg.APIURL = "https://" + s.AgentAPIAddr
		return cfg
	}
	t.Fatalf("no %s in the discovery Ignition", agentwire.ConfigPath)
	return agentwire.Config{}
}

// FakeInventory is a host that meets the default requirements.
func FakeInventory(hostname, mac string) *agentwire.Inventory {
	now := nowUTC()
	return &agentwire.Inventory{
		ReportTime: &now,
		Hostname:   hostname,
		CPU:        agentwire.CPU{Count: 4, Architecture: "x86_64", ModelName: "Test CPU", ClockMegahertz: 2400, Flags: []string{"svm"}},
		Memory:     agentwire.Memory{PhysicalBytes: 16 << 30, UsableBytes: 15 << 30},
		Interfaces: []agentwire.Interface{{Name: "eth0", MacAddress: mac, IPV4Addresses: []string{"198.18.0.10/24"}, IPV6Addresses: []string{}, Flags: []string{"up"}, HasCarrier: true, Mtu: 1500}},
		Disks: []agentwire.Disk{{ID: "/dev/disk/by-id/virtio-disk0", Name: "vda", Path: "/dev/vda", DriveType: "SSD", SizeBytes: 200_000_000_000,
			InstallationEligibility: agentwire.InstallationEligibility{Eligible: true, NotEligibleReasons: []string{}}}},
		SystemVendor:   agentwire.SystemVendor{Manufacturer: "QEMU", ProductName: "Standard PC (Q35 + ICH9, 2009)", Virtual: true},
		Boot:           agentwire.Boot{CurrentBootMode: "bios"},
		Virtualization: &agentwire.Virtualization{Verdict: agentwire.VirtSupported, Reason: "KVM runs guests", KVMDevicePresent: true, KVMUsable: true},
	}
}

// HostID makes a host UUID from n.
func HostID(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// MAC makes a MAC address from n.
func MAC(n int) string {
	return strings.ToLower(fmt.Sprintf("52:54:00:%02x:%02x:%02x", (n>>16)&0xff, (n>>8)&0xff, n&0xff))
}

func nowUTC() time.Time { return time.Now().UTC().Truncate(time.Second) }

// Host is a simulated host speaking the agent API with net/http, for tests
// outside the agent package.
type Host struct {
	s             *Stack
	Cfg           agentwire.Config
	NS, ID, Token string
}

func (h *Host) call(method, path, token string, in, out any) error {
	body, _ := json.Marshal(in)
	req, err := http.NewRequest(method, h.Cfg.APIURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := h.s.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// Register registers host n of ie and uploads a FakeInventory.
func (s *Stack) Register(t testing.TB, ie *v1beta1.InfraEnv, n int) *Host {
	t.Helper()
	h, err := s.TryRegister(t, ie, n)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TryRegister is Register returning the agent API's refusal.
func (s *Stack) TryRegister(t testing.TB, ie *v1beta1.InfraEnv, n int) (*Host, error) {
	t.Helper()
	return s.TryRegisterBooted(t, ie, n, "")
}

// RegisterBooted registers host n as booted from the ISO at mediaURL, the
// URL a BMC was told to insert: it sends the boot proof that ISO carries.
func (s *Stack) RegisterBooted(t testing.TB, ie *v1beta1.InfraEnv, n int, mediaURL string) *Host {
	t.Helper()
	h, err := s.TryRegisterBooted(t, ie, n, mediaURL)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TryRegisterBooted is RegisterBooted returning the agent API's refusal.
func (s *Stack) TryRegisterBooted(t testing.TB, ie *v1beta1.InfraEnv, n int, mediaURL string) (*Host, error) {
	t.Helper()
	return s.register(t, ie, n, mediaURL, false)
}

func (s *Stack) register(t testing.TB, ie *v1beta1.InfraEnv, n int, mediaURL string, noInventory bool) (*Host, error) {
	t.Helper()
	h := &Host{s: s, Cfg: s.AgentConfig(t, ie)}
	req := agentwire.RegisterRequest{InfraEnvUID: string(ie.UID), HostID: HostID(n), Identity: agentwire.HostIdentity{MACAddresses: []string{MAC(n)}}}
	if mediaURL != "" {
		u, err := url.Parse(mediaURL)
		if err != nil {
			return nil, err
		}
		q := u.Query()
		if q.Get("bmh") == "" || q.Get("proof") == "" {
			return nil, fmt.Errorf("media URL %s carries no boot proof", mediaURL)
		}
		req.BootProof = &agentwire.BootProof{BareMetalHost: q.Get("bmh"), Proof: q.Get("proof")}
	}
	var resp agentwire.RegisterResponse
	var err error
	// As the agent does, retry what the service says to retry: an Agent of
	// this ID deleted a moment ago, still alive in its cache.
	for deadline := time.Now().Add(30 * time.Second); ; {
		err = h.call(http.MethodPost, "/api/v1/infraenvs/"+ie.Namespace+"/"+ie.Name+"/hosts", h.Cfg.RegistrationToken, req, &resp)
		if err == nil || time.Now().After(deadline) || !strings.Contains(err.Error(), ": 503 ") && !strings.Contains(err.Error(), agentwire.CodeHostActive) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return nil, err
	}
	h.NS, h.ID, h.Token = resp.Namespace, resp.HostID, resp.AgentToken
	if noInventory {
		return h, nil
	}
	if err := h.call(http.MethodPut, "/api/v1/namespaces/"+h.NS+"/agents/"+h.ID+"/inventory", h.Token, FakeInventory(fmt.Sprintf("host-%d", n), MAC(n)), nil); err != nil {
		return nil, err
	}
	return h, nil
}

// RegisterOnly registers host n of ie and uploads nothing: its Agent is
// discovering until the host's inventory comes (PutInventory).
func (s *Stack) RegisterOnly(t testing.TB, ie *v1beta1.InfraEnv, n int) *Host {
	t.Helper()
	h, err := s.register(t, ie, n, "", true)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TryRegisterAs registers a host saying hostID and ident, as the agent does
// (with its derived ID where its UUID is taken, say), and uploads inv.
func (s *Stack) TryRegisterAs(t testing.TB, ie *v1beta1.InfraEnv, hostID string, ident agentwire.HostIdentity, inv *agentwire.Inventory) (*Host, error) {
	t.Helper()
	h := &Host{s: s, Cfg: s.AgentConfig(t, ie)}
	var resp agentwire.RegisterResponse
	err := h.call(http.MethodPost, "/api/v1/infraenvs/"+ie.Namespace+"/"+ie.Name+"/hosts", h.Cfg.RegistrationToken,
		agentwire.RegisterRequest{InfraEnvUID: string(ie.UID), HostID: hostID, Identity: ident}, &resp)
	if err != nil {
		return nil, err
	}
	h.NS, h.ID, h.Token = resp.Namespace, resp.HostID, resp.AgentToken
	return h, h.PutInventory(inv)
}

// PutInventory uploads an inventory, as the agent does.
func (h *Host) PutInventory(inv *agentwire.Inventory) error {
	return h.call(http.MethodPut, "/api/v1/namespaces/"+h.NS+"/agents/"+h.ID+"/inventory", h.Token, inv, nil)
}

// Heartbeat asks for instructions.
func (h *Host) Heartbeat() (agentwire.Instructions, error) { return h.HeartbeatWait(0) }

// HeartbeatWait asks for instructions, letting the service hold the
// request up to wait seconds until there are some, as the agent does.
func (h *Host) HeartbeatWait(wait int) (agentwire.Instructions, error) {
	var out agentwire.Instructions
	err := h.call(http.MethodPost, "/api/v1/namespaces/"+h.NS+"/agents/"+h.ID+"/instructions", h.Token, agentwire.InstructionsRequest{Time: time.Now(), WaitSeconds: wait}, &out)
	return out, err
}

// Progress reports an installation stage, as the agent does.
func (h *Host) Progress(stage string, percentage int, info string) error {
	return h.call(http.MethodPost, "/api/v1/namespaces/"+h.NS+"/agents/"+h.ID+"/progress", h.Token,
		agentwire.Progress{Stage: stage, Percentage: percentage, Info: info}, nil)
}

// StepResult reports how a step went.
func (h *Host) StepResult(step string, r agentwire.StepResult) error {
	return h.call(http.MethodPost, "/api/v1/namespaces/"+h.NS+"/agents/"+h.ID+"/steps/"+step, h.Token, r, nil)
}

// Silence makes the Agent ns/name look as if its host stopped a while ago
// (its Lease last renewed an hour back), as a host that rebooted is.
func (s *Stack) Silence(t testing.TB, ns, name string) {
	t.Helper()
	ctx := context.Background()
	var l coordinationv1.Lease
	key := client.ObjectKey{Namespace: Namespace, Name: "agent." + ns + "." + name}
	if err := s.Client.Get(ctx, key, &l); err != nil {
		t.Fatalf("lease of Agent %s/%s: %v", ns, name, err)
	}
	past := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	l.Spec.RenewTime = &past
	if err := s.Client.Update(ctx, &l); err != nil {
		t.Fatalf("silence Agent %s/%s: %v", ns, name, err)
	}
}

// Reregister registers host n again, as it does after rebooting into
// discovery (its earlier boot fell silent first), and uploads its
// inventory, as the agent does first in every boot.
func (h *Host) Reregister(t testing.TB, ie *v1beta1.InfraEnv, n int) {
	t.Helper()
	h.s.Silence(t, h.NS, h.ID)
	var resp agentwire.RegisterResponse
	var err error
	// The service reads Leases through its cache: until it sees the
	// silence, it holds the registration off (HostActive).
	for deadline := time.Now().Add(30 * time.Second); ; {
		err = h.call(http.MethodPost, "/api/v1/infraenvs/"+ie.Namespace+"/"+ie.Name+"/hosts", h.Cfg.RegistrationToken,
			agentwire.RegisterRequest{InfraEnvUID: string(ie.UID), HostID: HostID(n), Identity: agentwire.HostIdentity{MACAddresses: []string{MAC(n)}}}, &resp)
		if err == nil || !strings.Contains(err.Error(), agentwire.CodeHostActive) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	h.Token = resp.AgentToken
	if err := h.PutInventory(FakeInventory(fmt.Sprintf("host-%d", n), MAC(n))); err != nil {
		t.Fatal(err)
	}
}
