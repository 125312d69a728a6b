package server

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/bootpath"
	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/macindex"
	"github.com/agentboot/agentboot/internal/osimage"
)

// Outcomes of a boot script request, for the metric and the tests.
const (
	BootDiscovery = "discovery"   // the InfraEnv's discovery boot script
	BootDisk      = "disk"        // the host is installed: exit to local boot
	BootUnknown   = "unknown"     // nothing claims the MAC: exit
	BootAmbiguous = "ambiguous"   // more than one claim: exit, fix the objects
	BootNotReady  = "not-ready"   // the InfraEnv's image is not ready: wait, ask again
	BootBadMAC    = "bad-request" // no or malformed mac
	BootWrongArch = "wrong-arch"  // the host's architecture is not its InfraEnv's
	BootRefused   = "refused"     // the InfraEnv cannot be booted this way (GRUB: its kernel arguments)
)

var bootScripts = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "agentboot_boot_script_requests_total",
	Help: "Boot script requests by MAC, by outcome.",
}, []string{"outcome"})

// retrySeconds is how long iPXE waits before asking again for a host whose
// InfraEnv is not ready.
const retrySeconds = 30

// A boot script's dialect: iPXE's, or GRUB's for agentboot's netboot GRUB
// (arm64 UEFI hosts booted by the PXE service).
type dialect struct {
	route string
	// arch: the request names the host's CPU architecture.
	arch bool
	// exit says why and hands the host of arch (GRUB's only) to its disk
	// or its firmware; retry says why and has the host ask again later.
	exit  func(why, arch string) string
	retry func(why, mac string, r *http.Request) string
	// boot is the discovery script.
	boot func(h *Handler, out *discovery.Output, mac string) (string, error)
	// disk sends an installed host of arch to its disk.
	disk func(arch string) string
}

var (
	ipxeDialect = dialect{route: "/boot.ipxe?mac=${net0/mac}", exit: func(why, _ string) string { return exitScript(why) }, retry: retryScript,
		boot: func(_ *Handler, out *discovery.Output, _ string) (string, error) { return out.IPXEScript(), nil },
		disk: func(string) string { return discovery.IPXEExitScript }}
	grubDialect = dialect{route: "/boot.grub?mac=<mac>&arch=<grub_cpu>", arch: true, exit: discovery.GRUBExitScript,
		retry: func(why, _ string, _ *http.Request) string { return discovery.GRUBRetryScript(why) },
		boot: func(h *Handler, out *discovery.Output, mac string) (string, error) {
			return out.GRUBScript(h.opts.Settings, mac)
		},
		disk: discovery.GRUBDiskScript}
)

// serveBootScript answers /boot.ipxe?mac=: iPXE, sent here by the PXE
// service or by a site's PXE server, learns what this host boots. The MAC
// maps to an InfraEnv through the BareMetalHost that names it as its boot
// MAC, else to the InfraEnv labelled as the PXE default. Anything else gets
// a script that says why and exits, so the firmware moves on to the disk.
func (h *Handler) serveBootScript(w http.ResponseWriter, r *http.Request) {
	h.serveBootDecision(w, r, ipxeDialect)
}

// serveGRUBScript answers /boot.grub?mac=&arch=, the same decision for
// agentboot's netboot GRUB, which the PXE service hands arm64 UEFI hosts.
// arch is GRUB's CPU (arm64, x86_64): a host is never booted into an
// InfraEnv of another architecture.
func (h *Handler) serveGRUBScript(w http.ResponseWriter, r *http.Request) {
	h.serveBootDecision(w, r, grubDialect)
}

func (h *Handler) serveBootDecision(w http.ResponseWriter, r *http.Request, d dialect) {
	q := r.URL.Query()
	macs, ok := q["mac"]
	arch, archOK := "", true
	params := 1
	if d.arch {
		archs := q["arch"]
		params++
		if archOK = len(archs) == 1 && archs[0] != ""; archOK {
			arch = archs[0]
		}
	}
	if !ok || len(macs) != 1 || !archOK || len(q) != params {
		bootScripts.WithLabelValues(BootBadMAC).Inc()
		http.Error(w, "want exactly these query parameters: "+d.route, http.StatusBadRequest)
		return
	}
	mac := strings.ToLower(strings.ReplaceAll(macs[0], "-", ":"))
	if !agentwire.MACForm.MatchString(mac) {
		bootScripts.WithLabelValues(BootBadMAC).Inc()
		http.Error(w, fmt.Sprintf("malformed mac %q: want six hexadecimal bytes separated by colons", macs[0]), http.StatusBadRequest)
		return
	}
	// What the host is told when it is not booted, for its boot trace.
	var why string
	traced := d
	traced.exit = func(reason, arch string) string { why = reason; return d.exit(reason, arch) }
	traced.retry = func(reason, mac string, r *http.Request) string { why = reason; return d.retry(reason, mac, r) }
	outcome, script, err := h.bootScriptFor(r.Context(), mac, arch, traced, r)
	if err != nil {
		h.fail(w, err)
		return
	}
	loader := "iPXE"
	if d.arch {
		// GRUB asks through the PXE service, whose address is not the
		// host's: the PXE service records the files it fetches.
		loader = "GRUB (" + arch + ")"
	} else {
		h.macs.Put(h.clientAddr(r), mac, time.Now())
	}
	obs := boottrace.Observation{MAC: mac, Hop: boottrace.BootScript, At: time.Now(), OK: outcome == BootDiscovery, Outcome: outcome, Detail: loader + " from " + h.clientAddr(r)}
	if why != "" {
		obs.Outcome += ": " + why
	}
	h.observe(obs)
	bootScripts.WithLabelValues(outcome).Inc()
	if outcome == BootDiscovery {
		bootpath.Count(bootpath.BootScript)
	}
	if outcome != BootDiscovery {
		h.opts.Log.Info("boot script", "mac", mac, "outcome", outcome, "remote", r.RemoteAddr)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(script))
}

// grubArch is the catalog's name of GRUB's $grub_cpu.
func grubArch(cpu string) (string, bool) {
	switch cpu {
	case "arm64":
		return v1beta1.CPUArchitectureAarch64, true
	case "x86_64":
		return v1beta1.CPUArchitectureX86_64, true
	}
	return "", false
}

func (h *Handler) bootScriptFor(ctx context.Context, mac, cpu string, d dialect, r *http.Request) (string, string, error) {
	arch, archKnown := grubArch(cpu)
	exit := func(why string) string { return d.exit(why, arch) }
	ie, outcome, why, err := h.infraEnvForMAC(ctx, mac)
	if err != nil || ie == nil {
		return outcome, exit(why), err
	}
	name := ie.Namespace + "/" + ie.Name
	// Any of the namespace's Agents with this MAC: the host may have been
	// installed from another InfraEnv than the one its MAC now names, even
	// one of another architecture.
	if disk, err := h.bootsFromDisk(ctx, ie.Namespace, mac, ""); err != nil {
		return "", "", err
	} else if disk {
		return BootDisk, d.disk(arch), nil
	}
	if d.arch {
		if !archKnown {
			return BootWrongArch, exit(fmt.Sprintf("this host's boot loader runs on %q, which agentboot does not boot", cpu)), nil
		}
		if want := osimage.NormalizeArch(ie.Spec.CPUArchitecture); want != arch {
			return BootWrongArch, exit(fmt.Sprintf("InfraEnv %s boots %s hosts and this host is %s: give its BareMetalHost an InfraEnv with cpuArchitecture %s", name, want, arch, arch)), nil
		}
	}
	if c := conditions.Find(ie.Status.Conditions, v1beta1.ImageCreatedCondition); c == nil || c.Status != "True" {
		msg := "its image is being prepared"
		if c != nil && c.Message != "" {
			msg = c.Message
		}
		return BootNotReady, d.retry(fmt.Sprintf("InfraEnv %s is not ready: %s", name, msg), mac, r), nil
	}
	key, err := h.opts.Keys.Key()
	if err != nil {
		return BootNotReady, d.retry("the image service is starting", mac, r), nil
	}
	out, _, err := h.render(ctx, ie, key)
	if err != nil {
		// An OS image still downloading, or an InfraEnv the operator
		// still has to fix: either way the host waits and asks again.
		return BootNotReady, d.retry(fmt.Sprintf("InfraEnv %s: %s", name, err), mac, r), nil
	}
	script, err := d.boot(h, out, mac)
	if err != nil {
		return BootRefused, exit(fmt.Sprintf("InfraEnv %s: %s", name, err)), nil
	}
	return BootDiscovery, script, nil
}

// infraEnvForMAC finds the InfraEnv mac boots into. With none, it returns
// the outcome and why.
func (h *Handler) infraEnvForMAC(ctx context.Context, mac string) (*v1beta1.InfraEnv, string, string, error) {
	var hosts metal3.BareMetalHostList
	if err := h.opts.Reader.List(ctx, &hosts, client.MatchingFields{macindex.BootMAC: mac}); err != nil {
		return nil, "", "", err
	}
	live, claims, ignored := designated(h.opts.BootNS, hosts.Items)
	notDesignated := func(what string, names []string) string {
		return fmt.Sprintf("; %s %s ignored: not in a namespace designated for network boot (--boot-network-namespaces=%s)", what, strings.Join(names, ", "), h.opts.BootNS)
	}
	switch {
	case len(claims) > 1:
		return nil, BootAmbiguous, fmt.Sprintf("BareMetalHosts %s all have boot MAC %s", strings.Join(claims, ", "), mac), nil
	case len(claims) == 1:
		for _, bmh := range live {
			if bmh.Spec.ExternallyProvisioned {
				return nil, BootUnknown, fmt.Sprintf("BareMetalHost %s/%s is externally provisioned: agentboot does not boot it into discovery", bmh.Namespace, bmh.Name), nil
			}
			name := bmh.Labels[v1beta1.InfraEnvNameLabel]
			if name == "" {
				return nil, BootUnknown, fmt.Sprintf("BareMetalHost %s/%s has no %s label naming an InfraEnv", bmh.Namespace, bmh.Name, v1beta1.InfraEnvNameLabel), nil
			}
			var ie v1beta1.InfraEnv
			err := h.opts.Reader.Get(ctx, client.ObjectKey{Namespace: bmh.Namespace, Name: name}, &ie)
			if apierrors.IsNotFound(err) || (err == nil && !ie.DeletionTimestamp.IsZero()) {
				return nil, BootUnknown, fmt.Sprintf("BareMetalHost %s/%s names InfraEnv %s, which does not exist", bmh.Namespace, bmh.Name, name), nil
			}
			if err != nil {
				return nil, "", "", err
			}
			return &ie, "", "", nil
		}
	}
	var envs v1beta1.InfraEnvList
	if err := h.opts.Reader.List(ctx, &envs, client.MatchingLabels{v1beta1.PXEDefaultLabel: "true"}); err != nil {
		return nil, "", "", err
	}
	found, defaults, ignoredDefaults := designated(h.opts.BootNS, envs.Items)
	switch len(defaults) {
	case 0:
		why := fmt.Sprintf("no BareMetalHost has boot MAC %s and no InfraEnv is labelled %s=true", mac, v1beta1.PXEDefaultLabel)
		if len(ignored) > 0 {
			why += notDesignated("BareMetalHosts", ignored)
		}
		if len(ignoredDefaults) > 0 {
			why += notDesignated("InfraEnvs", ignoredDefaults)
		}
		return nil, BootUnknown, why, nil
	case 1:
		return found[0], "", "", nil
	}
	return nil, BootAmbiguous, fmt.Sprintf("InfraEnvs %s are all labelled %s=true", strings.Join(defaults, ", "), v1beta1.PXEDefaultLabel), nil
}

// designated keeps the objects of items that are not being deleted and are
// in namespaces designated for network boot, with their names, and names
// the ignored others.
func designated[T any, P interface {
	*T
	client.Object
}](ns Namespaces, items []T) (kept []P, names, ignored []string) {
	for i := range items {
		o := P(&items[i])
		name := o.GetNamespace() + "/" + o.GetName()
		switch {
		case !o.GetDeletionTimestamp().IsZero():
		case !ns.Has(o.GetNamespace()):
			ignored = append(ignored, name)
		default:
			kept = append(kept, o)
			names = append(names, name)
		}
	}
	sort.Strings(names)
	sort.Strings(ignored)
	return kept, names, ignored
}

// exitScript says why and gives the host back to its firmware's next boot
// device.
func exitScript(why string) string {
	return "#!ipxe\necho agentboot: " + discovery.IPXEText(why) + "\necho agentboot: not booting discovery; trying the next boot device\nexit\n"
}

// retryScript says why, waits, and asks again.
func retryScript(why, mac string, r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	self := scheme + "://" + r.Host + r.URL.Path + "?mac=" + mac
	return fmt.Sprintf("#!ipxe\necho agentboot: %s\necho agentboot: asking again in %d seconds\nsleep %d\nchain --replace --autofree %s\n",
		discovery.IPXEText(why), retrySeconds, retrySeconds, discovery.IPXEText(self))
}
