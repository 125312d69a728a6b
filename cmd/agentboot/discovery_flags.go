package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"

	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/osimage"
)

// discoveryFlags are the settings the manager and the image service must
// share: what hosts boot and where they reach agentboot.
type discoveryFlags struct {
	osImages      string
	streams       stringList
	cacheDir      string
	agentAPIURL   string
	imageURL      string
	imageHTTPURL  string
	caBundleFile  string
	isoOverHTTP   bool
	agentBinary   string
	agentArm64    string
	osImagesParse []osimage.Entry
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func (d *discoveryFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.osImages, "os-images", "", `OS image catalog entries as JSON, or @file: [{"version":"4.14","cpuArchitecture":"x86_64","url":"https://…/live.iso","sha256":"…","diskURL":"https://…/metal.raw.xz","diskSHA256":"…"}]`)
	fs.Var(&d.streams, "os-image-stream", "CoreOS stream metadata URL or path whose live ISOs join the catalog (repeatable)")
	fs.StringVar(&d.cacheDir, "image-cache-dir", "/var/cache/agentboot", "where downloaded OS images are kept")
	fs.StringVar(&d.agentAPIURL, "agent-api-url", "", "HTTPS URL hosts reach the agent API at, e.g. https://agentboot.example:7443")
	fs.StringVar(&d.imageURL, "image-service-url", "", "HTTPS URL hosts and BMCs reach the image service at, e.g. https://images.example:8443")
	fs.StringVar(&d.imageHTTPURL, "image-service-http-url", "", "plain-HTTP URL of the image service, for stock iPXE, e.g. http://images.example:8080")
	fs.StringVar(&d.caBundleFile, "ca-bundle-file", "", "PEM file of the CA that signed the agent API and image service certificates, given to hosts; empty when they are publicly trusted")
	fs.BoolVar(&d.isoOverHTTP, "iso-over-http", false, "publish ISO URLs over plain HTTP, for BMCs whose virtual media cannot fetch over HTTPS")
	fs.StringVar(&d.agentBinary, "agent-binary", besideExecutable("agent"), "the agent binary x86_64 hosts run (bin/agent)")
	fs.StringVar(&d.agentArm64, "agent-binary-arm64", "", "the agent binary aarch64 hosts run; default bin/agent-arm64 beside this executable when it exists, "+
		"else aarch64 InfraEnvs report that they have no agent")
}

// files are the flags naming files these settings read that a Deployment
// mounts; writable the directories they write.
func (d *discoveryFlags) files() []string    { return []string{"ca-bundle-file"} }
func (d *discoveryFlags) writable() []string { return []string{"image-cache-dir"} }

// besideExecutable is name in this executable's directory.
func besideExecutable(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return name
	}
	return filepath.Join(filepath.Dir(exe), name)
}

// catalogConfig parses the catalog settings.
func (d *discoveryFlags) catalogConfig(log logr.Logger) (osimage.Config, error) {
	cfg := osimage.Config{Streams: d.streams, CacheDir: d.cacheDir, Log: log.WithName("osimage")}
	if d.osImages != "" {
		raw := []byte(d.osImages)
		if strings.HasPrefix(d.osImages, "@") {
			var err error
			if raw, err = os.ReadFile(d.osImages[1:]); err != nil {
				return cfg, fmt.Errorf("--os-images: %w", err)
			}
		}
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg.Images); err != nil {
			return cfg, fmt.Errorf("--os-images is not a JSON list of {version, cpuArchitecture, url, sha256, diskURL, diskSHA256}: %w", err)
		}
	}
	if len(cfg.Images) == 0 && len(cfg.Streams) == 0 {
		return cfg, errors.New("no OS images: set --os-images or --os-image-stream")
	}
	return cfg, nil
}

// settings reads the CA bundle and digests the agent binary.
// checkURLs checks the URL flags, naming the flag. Not before the
// command's preflight (clusterFlags.start): a $(VAR) the kubelet left
// unexpanded is reported there, and waited out, not crashed on.
func (d *discoveryFlags) checkURLs() error {
	for _, u := range []struct{ flag, name, v string }{
		{"agent-api-url", discovery.AgentAPIURLName, d.agentAPIURL},
		{"image-service-url", discovery.ImageServiceURLName, d.imageURL},
		{"image-service-http-url", discovery.ImageServiceHTTPURLName, d.imageHTTPURL},
	} {
		if err := discovery.CheckURL(u.name, u.v); err != nil {
			return fmt.Errorf("--%s: %w", u.flag, err)
		}
	}
	return nil
}

func (d *discoveryFlags) settings() (discovery.Settings, error) {
	if err := d.checkURLs(); err != nil {
		return discovery.Settings{}, err
	}
	s := discovery.Settings{
		AgentAPIURL:         d.agentAPIURL,
		ImageServiceURL:     d.imageURL,
		ImageServiceHTTPURL: d.imageHTTPURL,
		ISOOverHTTP:         d.isoOverHTTP,
	}
	if d.caBundleFile != "" {
		ca, err := os.ReadFile(d.caBundleFile)
		if err != nil {
			return s, fmt.Errorf("--ca-bundle-file: %w", err)
		}
		s.CABundle = string(ca)
	}
	s.Agents = map[string]discovery.AgentBinary{}
	a, err := discovery.AgentBinaryFor(d.agentBinary, "x86_64")
	if err != nil {
		return s, fmt.Errorf("--agent-binary: %w (build it with make build)", err)
	}
	s.Agents["x86_64"] = a
	arm := d.agentArm64
	if arm == "" {
		if p := besideExecutable("agent-arm64"); fileExists(p) {
			arm = p
		}
	}
	if arm != "" {
		a, err := discovery.AgentBinaryFor(arm, "aarch64")
		if err != nil {
			return s, fmt.Errorf("--agent-binary-arm64: %w (build it with make build)", err)
		}
		s.Agents["aarch64"] = a
	}
	return s, s.Validate()
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
