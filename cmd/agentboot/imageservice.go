package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/agentboot/agentboot/cmd/agentboot/app"
	imageservice "github.com/agentboot/agentboot/image-service"
)

// imageServiceFlags are the image service's own settings.
type imageServiceFlags struct {
	cfg                       imageservice.Config
	bootNamespaces            string
	bootObservationsTokenFile string
}

func (i *imageServiceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&i.cfg.HTTPSAddr, "https-addr", ":8443", "HTTPS listen address of the image service")
	fs.StringVar(&i.cfg.HTTPAddr, "http-addr", ":8080", "plain-HTTP listen address (iPXE scripts, kernels, initrds, root filesystems)")
	fs.StringVar(&i.cfg.TLSCertFile, "tls-cert-file", "", "HTTPS serving certificate (PEM)")
	fs.StringVar(&i.cfg.TLSKeyFile, "tls-key-file", "", "HTTPS serving key (PEM)")
	fs.IntVar(&i.cfg.MaxConcurrentDownloads, "max-concurrent-downloads", 256, "per-InfraEnv image downloads (ISOs, initrds) served at once, and as many OS image files (kernels, root filesystems, disk images); more get 503 with Retry-After")
	fs.IntVar(&i.cfg.MaxDownloadsPerClient, "max-downloads-per-client", 8, "downloads one client address may have in progress; more get 503 with Retry-After")
	fs.IntVar(&i.cfg.MaxDownloadsPerInfraEnv, "max-downloads-per-infraenv", 0, "downloads of one InfraEnv's content (ISOs, initrds) in progress at once (default a quarter of --max-concurrent-downloads); more get 503 with Retry-After")
	fs.DurationVar(&i.cfg.DownloadStallTimeout, "download-stall-timeout", time.Minute, "a download whose client takes less than 4 MiB in this long is closed, freeing its slot; the amount doubles every 10 minutes a download lasts, to 16 MiB")
	fs.Func("trusted-proxies", "comma-separated addresses or CIDRs of proxies (an ingress) whose X-Forwarded-For names the client for --max-downloads-per-client; from anywhere else the header is ignored (default none)", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			p, err := netip.ParsePrefix(f)
			if err != nil {
				a, aerr := netip.ParseAddr(f)
				if aerr != nil {
					return fmt.Errorf("%q is neither an address nor a CIDR", f)
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			i.cfg.TrustedProxies = append(i.cfg.TrustedProxies, p.Masked())
		}
		return nil
	})
	fs.StringVar(&i.bootObservationsTokenFile, "boot-observations-token-file", "", "file holding the bearer token the PXE service posts its boot observations with (its own --boot-observations-token-file); empty: the image service takes none, and traces hold its own hops only")
	fs.StringVar(&i.bootNamespaces, "boot-network-namespaces", "", "comma-separated namespaces whose BareMetalHost boot MACs and "+
		"agentboot.io/pxe-default InfraEnvs decide where network-booting hosts go; \"*\" for every namespace (a boot network one team owns); "+
		"empty: none (hosts boot discovery through their ISO, or through the site's PXE server chainloading an InfraEnv's iPXE URL)")
}

// config is the image service's configuration from the flags.
func (i *imageServiceFlags) config() (imageservice.Config, error) {
	ns, err := imageservice.ParseNamespaces(i.bootNamespaces)
	if err != nil {
		return imageservice.Config{}, fmt.Errorf("--boot-network-namespaces: %w", err)
	}
	cfg := i.cfg
	cfg.BootNamespaces = ns
	if i.bootObservationsTokenFile != "" {
		if cfg.ObservationsToken, err = readToken(i.bootObservationsTokenFile); err != nil {
			return cfg, fmt.Errorf("--boot-observations-token-file: %w", err)
		}
	}
	return cfg, nil
}

func runImageService(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("image-service", flag.ContinueOnError)
	var (
		m managerFlags
		d discoveryFlags
		i imageServiceFlags
		c clusterFlags
	)
	c.register(fs)
	m.register(fs)
	d.register(fs)
	i.register(fs)
	// Every replica serves; none leads.
	if err := fs.Set("leader-elect", "false"); err != nil {
		return err
	}
	if err := fs.Set("health-probe-bind-address", ":8082"); err != nil {
		return err
	}
	if err := fs.Set("metrics-bind-address", ":8444"); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, cfg, err := c.start(ctx, fs, needs{Files: append(d.files(), "tls-cert-file", "tls-key-file", "boot-observations-token-file"), Writable: d.writable()}, m.probeAddr)
	if err != nil {
		return err
	}
	settings, err := d.settings()
	if err != nil {
		return err
	}
	catalog, err := newCatalog(d, log)
	if err != nil {
		return err
	}
	mgr, err := app.NewManager(cfg, m.options(), log)
	if err != nil {
		return err
	}
	imgCfg, err := i.config()
	if err != nil {
		return err
	}
	if err := app.Add(mgr, app.Components{Namespace: m.namespace, Catalog: catalog, Settings: settings, ImageService: &imgCfg}, log); err != nil {
		return err
	}
	log.Info("starting image service", "version", version)
	return mgr.Start(ctx)
}
