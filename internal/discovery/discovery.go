// Package discovery renders what an InfraEnv's hosts boot: the discovery
// Ignition config (built with Ignition's own config types), the compressed
// archive that carries it in an ISO or initrd, the kernel arguments of each
// boot flavour, the iPXE script and the signed URLs. Rendering is a pure
// function of the InfraEnv, its NMStateConfigs, the OS image and the
// settings, so the InfraEnv controller (which publishes URLs) and the image
// service (which serves them) compute the same content and version
// independently.
package discovery

import (
	"crypto/sha256"
	"crypto/sha512"
	"debug/elf"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_2/types"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/initramfs"
	"github.com/agentboot/agentboot/internal/liveiso"
	"github.com/agentboot/agentboot/internal/nmkeyfile"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/signing"
)

// Paths the discovery Ignition writes on the host.
const (
	AgentBinaryPath       = "/usr/local/bin/agent"
	StaticNetworksPath    = "/etc/agentboot/static-networks.json"
	TrustBundlePath       = "/etc/pki/ca-trust/source/anchors/agentboot-additional-trust-bundle.pem"
	ProxyEnvironmentPath  = "/etc/systemd/system.conf.d/10-agentboot-proxy.conf"
	AgentUnit             = "agent.service"
	StaticNetworkUnit     = "agentboot-static-network.service"
	baseIgnitionVersion   = "3.2.0"
	maxOverrideBytes      = 1 << 20
	registrationTokenNote = "registration token"
)

// Settings are the deployment-wide inputs every InfraEnv shares. The manager
// and the image service must be given the same ones.
type Settings struct {
	// AgentAPIURL is the HTTPS base URL hosts register at.
	AgentAPIURL string
	// ImageServiceURL is the HTTPS base URL of the image service.
	ImageServiceURL string
	// ImageServiceHTTPURL is its plain-HTTP base URL, for what stock iPXE
	// fetches (script, kernel, initrd) and for the root filesystem.
	ImageServiceHTTPURL string
	// ISOOverHTTP publishes the ISO URL over plain HTTP, for BMCs whose
	// virtual media cannot fetch over HTTPS.
	ISOOverHTTP bool
	// CABundle (PEM) verifies the agent API and image service certificates
	// on hosts; empty when they are publicly trusted.
	CABundle string
	// Agents are the agent binaries the image service serves, by the CPU
	// architecture they run on (x86_64, aarch64): an InfraEnv's hosts get
	// the one of its architecture, and none if there is none.
	Agents map[string]AgentBinary
}

// AgentBinary is one architecture's agent, checked to be built for it
// (AgentBinaryFor).
type AgentBinary struct {
	Path           string
	SHA256, SHA512 string
}

// ELF machines of the architectures agentboot builds its agent for.
var agentMachines = map[string]elf.Machine{"x86_64": elf.EM_X86_64, "aarch64": elf.EM_AARCH64}

// NoAgentError is an InfraEnv whose architecture has no agent binary.
type NoAgentError struct {
	Arch string
	Have []string
}

func (e *NoAgentError) Error() string {
	have := "none"
	if len(e.Have) > 0 {
		have = strings.Join(e.Have, ", ")
	}
	flag := "--agent-binary"
	if e.Arch == "aarch64" {
		flag = "--agent-binary-arm64"
	}
	return fmt.Sprintf("no agent binary for %s hosts (this agentboot has one for: %s); build it with make build and give it to the manager and the image service with %s",
		e.Arch, have, flag)
}

// bareIPv6 says whether URL text names an IPv6 address without brackets
// (2001:db8::1:8443 is itself an address: which part would be the port?).
func bareIPv6(text string) bool {
	_, rest, ok := strings.Cut(text, "://")
	host, _, _ := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(host, '@'); i >= 0 {
		host = host[i+1:] // user:password@
	}
	return ok && !strings.Contains(host, "[") && strings.Count(host, ":") > 1
}

// checkURLHost refuses addresses no host can reach agentboot at: an
// address with a zone (it names an interface of this machine, not the
// host's), a link-local one (IPv6 fe80::/10, IPv4 169.254/16: one link
// only), the unspecified and multicast ones. Loopback stays allowed: it is
// what a single-machine setup (tests, VMs behind user-mode networking)
// publishes.
func checkURLHost(u *url.URL) error {
	a, err := netip.ParseAddr(u.Hostname())
	switch {
	case err != nil:
		return nil // a name
	case a.Zone() != "":
		return errors.New("an address with a zone names an interface of this machine, which hosts do not have: give the address without it, or a name")
	case a.IsLinkLocalUnicast():
		return errors.New("a link-local address reaches no host beyond one link: use a global or unique local address, or a name")
	case a.IsUnspecified(), a.IsMulticast():
		return fmt.Errorf("%s is no address a host reaches this service at: use the service's own address, or a name", a)
	}
	return nil
}

// The URLs hosts reach agentboot at, by what they are.
const (
	AgentAPIURLName         = "agent API URL"
	ImageServiceURLName     = "image service URL"
	ImageServiceHTTPURLName = "image service HTTP URL"
)

// CheckURL checks that v can be one of the service URLs: name says which
// (AgentAPIURLName, ...), which the error carries.
func CheckURL(name, v string) error {
	scheme, port := "https", "8443"
	switch name {
	case AgentAPIURLName:
		port = "7443"
	case ImageServiceHTTPURLName:
		scheme, port = "http", "8080"
	}
	if bareIPv6(v) {
		return fmt.Errorf("%s %q: an IPv6 address in a URL goes in brackets, as %s://[2001:db8::1]:%s", name, v, scheme, port)
	}
	p, err := url.Parse(v)
	if err != nil || p.Scheme != scheme || p.Host == "" || p.RawQuery != "" {
		return fmt.Errorf("%s %q must be an %s:// URL without a query", name, v, scheme)
	}
	if err := checkURLHost(p); err != nil {
		return fmt.Errorf("%s %q: %w", name, v, err)
	}
	return nil
}

// Validate checks that the settings make usable URLs.
func (s Settings) Validate() error {
	for _, u := range []struct{ name, v string }{
		{AgentAPIURLName, s.AgentAPIURL}, {ImageServiceURLName, s.ImageServiceURL}, {ImageServiceHTTPURLName, s.ImageServiceHTTPURL},
	} {
		if err := CheckURL(u.name, u.v); err != nil {
			return err
		}
	}
	if len(s.Agents) == 0 {
		return errors.New("no agent binary")
	}
	for arch, a := range s.Agents {
		if _, ok := agentMachines[arch]; !ok {
			return fmt.Errorf("agent binary for unknown architecture %q", arch)
		}
		if len(a.SHA256) != 64 || len(a.SHA512) != 128 {
			return fmt.Errorf("the %s agent binary's digests are missing", arch)
		}
	}
	return nil
}

// Agent is the agent binary for hosts of arch.
func (s Settings) Agent(arch string) (AgentBinary, error) {
	arch = osimage.NormalizeArch(arch)
	a, ok := s.Agents[arch]
	if !ok {
		have := make([]string, 0, len(s.Agents))
		for k := range s.Agents {
			have = append(have, k)
		}
		sort.Strings(have)
		return a, &NoAgentError{Arch: arch, Have: have}
	}
	return a, nil
}

// AgentBinaryURL is where hosts of arch fetch the agent: content-addressed,
// so it is immutable and needs no token.
func (s Settings) AgentBinaryURL(arch string) (string, error) {
	a, err := s.Agent(arch)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(s.ImageServiceURL, "/") + "/agent/" + a.SHA256, nil
}

// InputError is a problem with what the InfraEnv's author wrote; the
// controller reports it on the InfraEnv instead of retrying.
type InputError struct{ msg string }

func (e *InputError) Error() string { return e.msg }

func inputErrorf(format string, args ...any) error {
	return &InputError{msg: fmt.Sprintf(format, args...)}
}

// Input is one InfraEnv and what it refers to.
type Input struct {
	InfraEnv *v1beta1.InfraEnv
	// NMStateConfigs are the configs the InfraEnv's selector picks.
	NMStateConfigs []v1beta1.NMStateConfig
	// Image is the full live ISO from the catalog, and ImageKey its name there.
	Image    *osimage.Image
	ImageKey osimage.Key
	Key      signing.Key
}

// Output is everything a host of the InfraEnv boots.
type Output struct {
	// Version identifies the content; it is part of every URL.
	Version string
	// Ignition is the discovery Ignition config (JSON).
	Ignition []byte
	// Archive is the xz-compressed cpio holding config.ign and the static
	// network keyfiles, for the ISO's embed area and the PXE initrd.
	Archive []byte
	// Network is the NetworkManager keyfiles of the NMStateConfigs, in
	// the archive under nmkeyfile.Dir, applied before Ignition runs.
	Network []initramfs.File
	// Notes are what the InfraEnv's owner should know about an image that
	// was made: NMStateConfigs applied only after boot.
	Notes []string
	// FullKargs and MinimalKargs go into the ISOs' kernel-argument areas.
	FullKargs, MinimalKargs string
	// PXEKargs follow the kernel URL in the iPXE script.
	PXEKargs  string
	ImageType v1beta1.ImageType
	URLs      URLs
}

// Render computes the discovery content of one InfraEnv.
func Render(in Input, s Settings) (*Output, error) {
	ie := in.InfraEnv
	if in.Image == nil || in.ImageKey.Arch == "" || in.ImageKey.Version == "" {
		return nil, errors.New("no OS image")
	}
	if !in.Key.Valid() {
		return nil, signing.ErrNoKey
	}
	ign, parts, err := renderIgnition(in, s)
	if err != nil {
		return nil, err
	}
	network, notes, err := networkFiles(in.NMStateConfigs)
	if err != nil {
		return nil, err
	}
	if len(network) > 0 {
		// CoreOS replaces every initramfs profile with the keyfiles,
		// including those dracut made of network kernel arguments.
		for _, k := range ie.Spec.KernelArguments {
			key, _, _ := strings.Cut(k.Value, "=")
			if k.Operation != "delete" && slices.Contains([]string{"ip", "bond", "vlan", "bridge", "nameserver"}, key) {
				notes = append(notes, fmt.Sprintf("kernel argument %q is ignored before Ignition: with NMStateConfig keyfiles in the image, CoreOS's initramfs uses those instead", k.Value))
			}
		}
		if !in.Image.Layout.InitrdNetwork {
			// Older CoreOS live images: harmless, and no help.
			notes = append(notes, fmt.Sprintf("OS image %s does not apply network keyfiles before Ignition (no live-initrd-network in %s): "+
				"NMStateConfigs apply after boot only, and hosts without DHCP need ip= kernel arguments", in.ImageKey, liveiso.FeaturesPath))
		}
	}
	archive, err := embedArchive(ign, network)
	if err != nil {
		return nil, err
	}
	area := in.Image.Layout.Ignition.Length
	if int64(len(archive)) > area {
		return nil, inputErrorf("the discovery Ignition is %d KiB compressed, but the ISO's embed area holds %d KiB; its largest parts: %s",
			(len(archive)+1023)/1024, area/1024, parts.describe())
	}
	kargs, err := kernelArguments(in.Image.Layout.Kargs.Default, ie.Spec.KernelArguments)
	if err != nil {
		return nil, err
	}
	out := &Output{
		Ignition:  ign,
		Archive:   archive,
		Network:   network,
		Notes:     notes,
		ImageType: imageType(ie),
	}
	out.Version = version(out, in, kargs, s)
	out.URLs = newURLs(s, in.ImageKey, string(ie.UID), out.Version, in.Key.Token(signing.PurposeImage, string(ie.UID), out.Version))

	out.FullKargs = strings.Join(kargs, " ")
	live := without(kargs, "coreos.liveiso")
	out.MinimalKargs = strings.Join(append(live, "coreos.live.rootfs_url="+out.URLs.Rootfs), " ")
	pxe := append([]string{"initrd=initrd", "coreos.live.rootfs_url=" + out.URLs.Rootfs}, live...)
	for _, required := range []string{"ignition.firstboot", "ignition.platform.id=metal"} {
		if !contains(pxe, required) {
			pxe = append(pxe, required)
		}
	}
	// iPXE expands this to the MAC it booted from; the agent reads it.
	pxe = append(pxe, "BOOTIF=01-${netX/mac:hexhyp}")
	out.PXEKargs = strings.Join(pxe, " ")

	// Every area must hold the arguments of its flavour.
	for name, k := range map[string]string{"full ISO": out.FullKargs, "minimal ISO": out.MinimalKargs} {
		if _, err := in.Image.Layout.Kargs.Render(k); err != nil {
			if errors.Is(err, liveiso.ErrKargsTooLong) {
				return nil, inputErrorf("kernel arguments of the %s: %v", name, err)
			}
			return nil, err
		}
	}
	return out, nil
}

// WithBootProof is the content for an ISO inserted through one
// BareMetalHost's BMC: the same, with the proof in BootProofPath. Its
// version and URLs are the InfraEnv's: the proof is a query parameter of
// the URL the BMC controller inserts. area is the ISO's embed area.
func (o *Output) WithBootProof(p agentwire.BootProof, area int64) (*Output, error) {
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	var add types.Config
	add.Ignition.Version = baseIgnitionVersion
	add.Storage.Files = []types.File{{
		Node:          types.Node{Path: agentwire.BootProofPath, Overwrite: ptr(true)},
		FileEmbedded1: types.FileEmbedded1{Mode: ptr(0o600), Contents: types.Resource{Source: dataURL(raw)}},
	}}
	addJSON, err := json.Marshal(add)
	if err != nil {
		return nil, err
	}
	ign, err := MergeOverride("boot proof", o.Ignition, addJSON)
	if err != nil {
		return nil, err
	}
	archive, err := embedArchive(ign, o.Network)
	if err != nil {
		return nil, err
	}
	if int64(len(archive)) > area {
		return nil, inputErrorf("the discovery Ignition with a BareMetalHost's boot proof is %d KiB compressed, but the ISO's embed area holds %d KiB", (len(archive)+1023)/1024, area/1024)
	}
	out := *o
	out.Ignition, out.Archive = ign, archive
	return &out, nil
}

func imageType(ie *v1beta1.InfraEnv) v1beta1.ImageType {
	if ie.Spec.ImageType == v1beta1.ImageTypeMinimalISO {
		return v1beta1.ImageTypeMinimalISO
	}
	return v1beta1.ImageTypeFullISO
}

// version hashes everything that changes what a host boots. URLs are derived
// from it, so they are not part of it.
func version(out *Output, in Input, kargs []string, s Settings) string {
	h := sha256.New()
	for _, part := range []string{
		string(out.Ignition),
		in.Image.ID,
		string(out.ImageType),
		strings.Join(kargs, " "),
		string(in.InfraEnv.Spec.IPXEScriptType),
		s.ImageServiceURL, s.ImageServiceHTTPURL,
	} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	// The keyfiles follow from the Ignition's NMStateConfigs, but also
	// from the converter: a new agentboot that writes them differently
	// serves different bytes under a new version. Without any, the version
	// is what it was before keyfiles existed.
	for _, f := range out.Network {
		h.Write([]byte(f.Path))
		h.Write([]byte{0})
		h.Write(f.Data)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// parts records the raw size of what the InfraEnv's author contributed, to
// explain an Ignition that does not fit.
type parts map[string]int

func (p parts) describe() string {
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		return p[names[i]] > p[names[j]] || p[names[i]] == p[names[j]] && names[i] < names[j]
	})
	var out []string
	for _, n := range names {
		if p[n] > 0 {
			out = append(out, fmt.Sprintf("%s (%d KiB)", n, (p[n]+1023)/1024))
		}
	}
	if len(out) > 3 {
		out = out[:3]
	}
	return strings.Join(out, ", ")
}

func dataURL(b []byte) *string {
	s := "data:;base64," + base64.StdEncoding.EncodeToString(b)
	return &s
}

func ptr[T any](v T) *T { return &v }

func renderIgnition(in Input, s Settings) ([]byte, parts, error) {
	ie := in.InfraEnv
	sizes := parts{
		"ignitionConfigOverride": len(ie.Spec.IgnitionConfigOverride),
		"additionalTrustBundle":  len(ie.Spec.AdditionalTrustBundle),
		"sshAuthorizedKey":       len(ie.Spec.SSHAuthorizedKey),
	}
	agentCfg := agentwire.Config{
		APIURL:            s.AgentAPIURL,
		InfraEnv:          agentwire.InfraEnvRef{Namespace: ie.Namespace, Name: ie.Name, UID: string(ie.UID)},
		RegistrationToken: in.Key.RegistrationToken(string(ie.UID), signing.Epoch(ie.Annotations[signing.RotateAnnotation])),
		CABundle:          s.CABundle,
		NTPSources:        ie.Spec.AdditionalNTPSources,
	}
	if p := ie.Spec.Proxy; p != nil && (p.HTTPProxy != "" || p.HTTPSProxy != "") {
		agentCfg.Proxy = &agentwire.Proxy{HTTPProxy: p.HTTPProxy, HTTPSProxy: p.HTTPSProxy, NoProxy: p.NoProxy}
	}
	agentJSON, err := json.Marshal(agentCfg)
	if err != nil {
		return nil, nil, err
	}

	var cfg types.Config
	cfg.Ignition.Version = baseIgnitionVersion
	if s.CABundle != "" {
		cfg.Ignition.Security.TLS.CertificateAuthorities = []types.Resource{{Source: dataURL([]byte(s.CABundle))}}
	}
	if p := agentCfg.Proxy; p != nil {
		if p.HTTPProxy != "" {
			cfg.Ignition.Proxy.HTTPProxy = ptr(p.HTTPProxy)
		}
		if p.HTTPSProxy != "" {
			cfg.Ignition.Proxy.HTTPSProxy = ptr(p.HTTPSProxy)
		}
		for _, n := range splitNoProxy(p.NoProxy) {
			cfg.Ignition.Proxy.NoProxy = append(cfg.Ignition.Proxy.NoProxy, types.NoProxyItem(n))
		}
	}
	if key := strings.TrimSpace(ie.Spec.SSHAuthorizedKey); key != "" {
		var keys []types.SSHAuthorizedKey
		for _, line := range strings.Split(key, "\n") {
			if line = strings.TrimSpace(line); line != "" {
				keys = append(keys, types.SSHAuthorizedKey(line))
			}
		}
		cfg.Passwd.Users = []types.PasswdUser{{Name: "core", SSHAuthorizedKeys: keys}}
	}
	file := func(path string, mode int, contents types.Resource) types.File {
		return types.File{
			Node:          types.Node{Path: path, Overwrite: ptr(true)},
			FileEmbedded1: types.FileEmbedded1{Mode: ptr(mode), Contents: contents},
		}
	}
	agentURL, err := s.AgentBinaryURL(in.ImageKey.Arch)
	if err != nil {
		return nil, nil, err
	}
	agentBin, _ := s.Agent(in.ImageKey.Arch)
	cfg.Storage.Files = append(cfg.Storage.Files,
		file(AgentBinaryPath, 0o755, types.Resource{
			Source:       ptr(agentURL),
			Verification: types.Verification{Hash: ptr("sha512-" + agentBin.SHA512)},
		}),
		file(agentwire.ConfigPath, 0o600, types.Resource{Source: dataURL(agentJSON)}),
	)
	if tb := strings.TrimSpace(ie.Spec.AdditionalTrustBundle); tb != "" {
		cfg.Storage.Files = append(cfg.Storage.Files, file(TrustBundlePath, 0o644, types.Resource{Source: dataURL([]byte(tb + "\n"))}))
	}
	if p := agentCfg.Proxy; p != nil {
		env := "[Manager]\nDefaultEnvironment=" + proxyEnvironment(p) + "\n"
		cfg.Storage.Files = append(cfg.Storage.Files, file(ProxyEnvironmentPath, 0o644, types.Resource{Source: dataURL([]byte(env))}))
	}
	cfg.Systemd.Units = []types.Unit{{Name: AgentUnit, Enabled: ptr(true), Contents: ptr(agentUnit)}}
	if len(in.NMStateConfigs) > 0 {
		nets, err := staticNetworks(in.NMStateConfigs)
		if err != nil {
			return nil, nil, err
		}
		sizes["NMStateConfigs"] = len(nets)
		cfg.Storage.Files = append(cfg.Storage.Files, file(StaticNetworksPath, 0o600, types.Resource{Source: dataURL(nets)}))
		cfg.Systemd.Units = append(cfg.Systemd.Units, types.Unit{Name: StaticNetworkUnit, Enabled: ptr(true), Contents: ptr(staticNetworkUnit)})
	}
	base, err := json.Marshal(cfg)
	if err != nil {
		return nil, nil, err
	}
	if ie.Spec.IgnitionConfigOverride == "" {
		return base, sizes, nil
	}
	merged, err := MergeOverride("ignitionConfigOverride", base, []byte(ie.Spec.IgnitionConfigOverride))
	if err != nil {
		return nil, nil, err
	}
	return merged, sizes, nil
}

const agentUnit = `[Unit]
Description=agentboot discovery agent
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
ExecStart=/usr/local/bin/agent run --config /etc/agentboot/agent.json
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
`

const staticNetworkUnit = `[Unit]
Description=Apply this host's static network configuration (agentboot NMStateConfig)
DefaultDependencies=no
Before=NetworkManager.service network-pre.target
Wants=network-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/bin/agent static-network --config /etc/agentboot/static-networks.json --out /etc/nmstate

[Install]
WantedBy=multi-user.target
`

func splitNoProxy(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// proxyEnvironment is a systemd DefaultEnvironment value; systemd quotes each
// assignment in double quotes.
func proxyEnvironment(p *agentwire.Proxy) string {
	var env []string
	add := func(k, v string) {
		if v != "" {
			env = append(env, fmt.Sprintf("%q", k+"="+v))
		}
	}
	add("HTTP_PROXY", p.HTTPProxy)
	add("http_proxy", p.HTTPProxy)
	add("HTTPS_PROXY", p.HTTPSProxy)
	add("https_proxy", p.HTTPSProxy)
	add("NO_PROXY", p.NoProxy)
	add("no_proxy", p.NoProxy)
	return strings.Join(env, " ")
}

// embedArchive is the initramfs archive hosts boot with: config.ign and
// the static network keyfiles.
func embedArchive(ign []byte, network []initramfs.File) ([]byte, error) {
	return initramfs.Archive(initramfs.XZ, append([]initramfs.File{{Path: "config.ign", Mode: 0o600, Data: ign}}, network...)...)
}

// networkFiles converts the NMStateConfigs to NetworkManager keyfiles for
// the initramfs (docs/discovery.md#static-networking). A config beyond
// what converts is left to the agent's after-boot path and noted; a wrong
// one is the InfraEnv's error.
func networkFiles(cfgs []v1beta1.NMStateConfig) ([]initramfs.File, []string, error) {
	var files []initramfs.File
	var notes []string
	owner := map[string]string{} // MAC → the config whose profiles bind it
	paths := map[string]bool{nmkeyfile.Dir + "/" + nmkeyfile.FallbackName: true}
	for _, c := range byName(cfgs) {
		if len(c.Spec.NetConfig.Raw) == 0 {
			continue // nothing to configure
		}
		macs := map[string]string{}
		for _, i := range c.Spec.Interfaces {
			if i != nil {
				macs[i.Name] = i.MacAddress
			}
		}
		kf, err := nmkeyfile.Convert(c.Name, c.Spec.NetConfig.Raw, macs)
		var unsupported *nmkeyfile.Unsupported
		switch {
		case errors.As(err, &unsupported):
			notes = append(notes, unsupported.Error())
			continue
		case err != nil:
			return nil, nil, inputErrorf("%v", err)
		}
		// Two profiles for one NIC: NetworkManager would pick either. The
		// MACs are those the profiles bind, wherever the config named them.
		if i := slices.IndexFunc(kf, func(f nmkeyfile.File) bool { return f.MAC != "" && owner[f.MAC] != "" }); i >= 0 {
			notes = append(notes, fmt.Sprintf("NMStateConfig %s is left out of the initramfs: MAC %s is already NMStateConfig %s's", c.Name, kf[i].MAC, owner[kf[i].MAC]))
			continue
		}
		for _, f := range kf {
			if f.MAC != "" {
				owner[f.MAC] = c.Name
			}
			// Names come from validated parts; a path separator or a name
			// twice would put a file elsewhere or over another's.
			p := nmkeyfile.Dir + "/" + f.Name
			if strings.ContainsAny(f.Name, "/\\") || paths[p] {
				return nil, nil, fmt.Errorf("NMStateConfig %s: keyfile name %q is not a file of its own", c.Name, f.Name)
			}
			paths[p] = true
			files = append(files, initramfs.File{Path: p, Mode: 0o600, Data: f.Data})
		}
	}
	if len(files) > 0 {
		// CoreOS drops NetworkManager's own DHCP profiles once there are
		// keyfiles: every other NIC, and every host without a config,
		// gets DHCP from this one.
		f := nmkeyfile.Fallback()
		files = append(files, initramfs.File{Path: nmkeyfile.Dir + "/" + f.Name, Mode: 0o600, Data: f.Data})
	}
	return files, notes, nil
}

// byName is cfgs sorted by name, the order every image lists them in.
func byName(cfgs []v1beta1.NMStateConfig) []v1beta1.NMStateConfig {
	sorted := slices.Clone(cfgs)
	slices.SortFunc(sorted, func(a, b v1beta1.NMStateConfig) int { return strings.Compare(a.Name, b.Name) })
	return sorted
}

// staticNetworks serialises the selected NMStateConfigs for the agent.
func staticNetworks(cfgs []v1beta1.NMStateConfig) ([]byte, error) {
	var nets []agentwire.StaticNetwork
	for _, c := range byName(cfgs) {
		n := agentwire.StaticNetwork{Name: c.Name}
		for _, i := range c.Spec.Interfaces {
			if i == nil {
				continue
			}
			n.Interfaces = append(n.Interfaces, agentwire.StaticInterface{Name: i.Name, MACAddress: strings.ToLower(i.MacAddress)})
		}
		if len(c.Spec.NetConfig.Raw) > 0 {
			if err := json.Unmarshal(c.Spec.NetConfig.Raw, &n.State); err != nil {
				return nil, inputErrorf("NMStateConfig %s: config is not an object: %v", c.Name, err)
			}
		}
		nets = append(nets, n)
	}
	return json.Marshal(nets)
}

// AgentBinaryFor digests the agent binary at path, after checking that it
// is a 64-bit ELF executable for arch: a binary for another architecture
// is never served.
func AgentBinaryFor(path, arch string) (AgentBinary, error) {
	want, ok := agentMachines[arch]
	if !ok {
		return AgentBinary{}, fmt.Errorf("agent binary %s: unknown architecture %q", path, arch)
	}
	f, err := elf.Open(path)
	if err != nil {
		return AgentBinary{}, fmt.Errorf("agent binary %s: %w", path, err)
	}
	machine, class := f.Machine, f.Class
	f.Close()
	if machine != want || class != elf.ELFCLASS64 {
		return AgentBinary{}, fmt.Errorf("agent binary %s is built for %s (%s), not %s", path, machine, class, arch)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return AgentBinary{}, fmt.Errorf("agent binary: %w", err)
	}
	s256 := sha256.Sum256(data)
	s512 := sha512.Sum512(data)
	return AgentBinary{Path: path, SHA256: hex.EncodeToString(s256[:]), SHA512: hex.EncodeToString(s512[:])}, nil
}
