package main

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/coreos/ignition/v2/config/v3_6"
	"github.com/coreos/ignition/v2/config/v3_6/types"
	"github.com/vincent-petithory/dataurl"
	"golang.org/x/net/http/httpproxy"
)

// fetcher gets Ignition resources: data URLs and http(s) with the config's
// CAs and proxy.
type fetcher struct {
	client *http.Client
}

func newFetcher(cas [][]byte, proxy types.Proxy) *fetcher {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	for _, pem := range cas {
		pool.AppendCertsFromPEM(pem)
	}
	pc := &httpproxy.Config{}
	if proxy.HTTPProxy != nil {
		pc.HTTPProxy = *proxy.HTTPProxy
	}
	if proxy.HTTPSProxy != nil {
		pc.HTTPSProxy = *proxy.HTTPSProxy
	}
	var np []string
	for _, n := range proxy.NoProxy {
		np = append(np, string(n))
	}
	pc.NoProxy = strings.Join(np, ",")
	proxyFunc := pc.ProxyFunc()
	return &fetcher{client: &http.Client{
		Timeout: 5 * time.Minute,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool},
			Proxy:           func(r *http.Request) (*url.URL, error) { return proxyFunc(r.URL) },
		},
	}}
}

// fetch returns a resource's content, checked against its verification hash
// and decompressed.
func (f *fetcher) fetch(r types.Resource) ([]byte, error) {
	if r.Source == nil {
		return nil, nil
	}
	src := *r.Source
	var data []byte
	switch {
	case strings.HasPrefix(src, "data:"):
		du, err := dataurl.DecodeString(src)
		if err != nil {
			return nil, fmt.Errorf("data URL: %w", err)
		}
		data = du.Data
	case strings.HasPrefix(src, "http://"), strings.HasPrefix(src, "https://"):
		var err error
		for attempt := 1; ; attempt++ {
			data, err = f.get(src, r.HTTPHeaders)
			if err == nil {
				break
			}
			if attempt == 8 {
				return nil, err
			}
			logf("ignition: fetch %s (attempt %d): %v", redact(src), attempt, err)
			time.Sleep(time.Duration(attempt) * 2 * time.Second)
		}
	default:
		return nil, fmt.Errorf("unsupported source scheme in %s", redact(src))
	}
	if r.Verification.Hash != nil {
		if err := verify(data, *r.Verification.Hash); err != nil {
			return nil, fmt.Errorf("%s: %w", redact(src), err)
		}
	}
	if r.Compression != nil && *r.Compression == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	}
	return data, nil
}

func (f *fetcher) get(src string, headers types.HTTPHeaders) ([]byte, error) {
	req, err := http.NewRequest(http.MethodGet, src, nil)
	if err != nil {
		return nil, err
	}
	for _, h := range headers {
		if h.Value != nil {
			req.Header.Set(h.Name, *h.Value)
		}
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %s", resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// redact drops the query string, where signed URLs carry their token.
func redact(u string) string {
	if i := strings.IndexByte(u, '?'); i >= 0 {
		return u[:i] + "?…"
	}
	return u
}

func verify(data []byte, spec string) error {
	algo, want, ok := strings.Cut(spec, "-")
	if !ok {
		return fmt.Errorf("verification hash %q is not <algorithm>-<hex>", spec)
	}
	var h hash.Hash
	switch algo {
	case "sha512":
		h = sha512.New()
	case "sha256":
		h = sha256.New()
	default:
		return fmt.Errorf("unsupported hash %s", algo)
	}
	h.Write(data)
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s mismatch: got %s, want %s", algo, got, want)
	}
	return nil
}

// applyIgnition applies the config at path and returns the enabled units to
// run. A missing config is reported, not an error: the image then idles.
func applyIgnition(path string) ([]unit, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		logf("ignition: no config at %s", path)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	logf("ignition: found %s (%d bytes)", path, len(raw))
	cfg, rpt, err := v3_6.ParseCompatibleVersion(raw)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %v: %s", path, err, rpt.String())
	}
	cfg, f, err := resolveMerges(cfg, 0)
	if err != nil {
		return nil, err
	}
	nfiles := 0
	for _, d := range cfg.Storage.Directories {
		if err := os.MkdirAll(d.Path, mode(d.Mode, 0o755)); err != nil {
			return nil, err
		}
	}
	for _, file := range cfg.Storage.Files {
		if err := writeFile(f, file); err != nil {
			return nil, fmt.Errorf("file %s: %w", file.Path, err)
		}
		nfiles++
	}
	for _, l := range cfg.Storage.Links {
		if l.Target == nil {
			continue
		}
		_ = os.MkdirAll(filepath.Dir(l.Path), 0o755)
		_ = os.Remove(l.Path)
		if l.Hard != nil && *l.Hard {
			err = os.Link(*l.Target, l.Path)
		} else {
			err = os.Symlink(*l.Target, l.Path)
		}
		if err != nil {
			return nil, fmt.Errorf("link %s: %w", l.Path, err)
		}
	}
	for _, u := range cfg.Passwd.Users {
		if err := addUser(u); err != nil {
			return nil, fmt.Errorf("user %s: %w", u.Name, err)
		}
	}
	for _, ignored := range []struct {
		what  string
		count int
	}{{"storage.disks", len(cfg.Storage.Disks)}, {"storage.filesystems", len(cfg.Storage.Filesystems)}, {"storage.raid", len(cfg.Storage.Raid)}, {"storage.luks", len(cfg.Storage.Luks)}} {
		if ignored.count > 0 {
			logf("ignition: %s ignored (the dev OS does not partition disks)", ignored.what)
		}
	}
	units, err := writeUnits(cfg.Systemd.Units)
	if err != nil {
		return nil, err
	}
	logf("ignition: applied config: %d files, %d users, %d units to start", nfiles, len(cfg.Passwd.Users), len(units))
	return units, nil
}

// resolveMerges fetches the configs named in ignition.config.merge/replace.
func resolveMerges(cfg types.Config, depth int) (types.Config, *fetcher, error) {
	var cas [][]byte
	f := newFetcher(nil, cfg.Ignition.Proxy)
	for _, ca := range cfg.Ignition.Security.TLS.CertificateAuthorities {
		pem, err := f.fetch(ca)
		if err != nil {
			return cfg, nil, fmt.Errorf("certificate authority: %w", err)
		}
		cas = append(cas, pem)
	}
	f = newFetcher(cas, cfg.Ignition.Proxy)
	if depth > 5 {
		return cfg, f, errors.New("config references nest too deep")
	}
	if cfg.Ignition.Config.Replace.Source != nil {
		child, err := fetchConfig(f, cfg.Ignition.Config.Replace)
		if err != nil {
			return cfg, nil, err
		}
		return resolveMerges(child, depth+1)
	}
	merges := cfg.Ignition.Config.Merge
	cfg.Ignition.Config.Merge = nil
	for _, m := range merges {
		child, err := fetchConfig(f, m)
		if err != nil {
			return cfg, nil, err
		}
		child, _, err = resolveMerges(child, depth+1)
		if err != nil {
			return cfg, nil, err
		}
		cfg = v3_6.Merge(cfg, child)
	}
	return cfg, f, nil
}

func fetchConfig(f *fetcher, r types.Resource) (types.Config, error) {
	raw, err := f.fetch(r)
	if err != nil {
		return types.Config{}, fmt.Errorf("fetch referenced config: %w", err)
	}
	cfg, rpt, err := v3_6.ParseCompatibleVersion(raw)
	if err != nil {
		return types.Config{}, fmt.Errorf("parse referenced config: %v: %s", err, rpt.String())
	}
	logf("ignition: fetched referenced config %s (%d bytes)", redact(*r.Source), len(raw))
	return cfg, nil
}

func mode(m *int, def os.FileMode) os.FileMode {
	if m == nil {
		return def
	}
	return os.FileMode(*m) & os.ModePerm
}

func writeFile(f *fetcher, file types.File) error {
	data, err := f.fetch(file.Contents)
	if err != nil {
		return err
	}
	for _, a := range file.Append {
		more, err := f.fetch(a)
		if err != nil {
			return err
		}
		data = append(data, more...)
	}
	if err := os.MkdirAll(filepath.Dir(file.Path), 0o755); err != nil {
		return err
	}
	tmp := file.Path + ".devinit-tmp"
	if err := os.WriteFile(tmp, data, mode(file.Mode, 0o644)); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode(file.Mode, 0o644)); err != nil {
		return err
	}
	if err := os.Rename(tmp, file.Path); err != nil {
		return err
	}
	how := "inline"
	if src := file.Contents.Source; src != nil && !strings.HasPrefix(*src, "data:") {
		how = "from " + redact(*src)
		if file.Contents.Verification.Hash != nil {
			algo, _, _ := strings.Cut(*file.Contents.Verification.Hash, "-")
			how += ", " + algo + " verified"
		}
	}
	logf("ignition: wrote %s (%d bytes, %s)", file.Path, len(data), how)
	return nil
}

func addUser(u types.PasswdUser) error {
	home := "/home/" + u.Name
	if u.Name == "root" {
		home = "/root"
	}
	passwd, _ := os.ReadFile("/etc/passwd")
	if !bytes.Contains(passwd, []byte("\n"+u.Name+":")) && !bytes.HasPrefix(passwd, []byte(u.Name+":")) {
		line := fmt.Sprintf("%s:x:1000:1000:%s:%s:/bin/sh\n", u.Name, u.Name, home)
		if err := os.WriteFile("/etc/passwd", append(passwd, line...), 0o644); err != nil {
			return err
		}
	}
	if len(u.SSHAuthorizedKeys) == 0 {
		return nil
	}
	var keys strings.Builder
	for _, k := range u.SSHAuthorizedKeys {
		keys.WriteString(string(k) + "\n")
	}
	if err := os.MkdirAll(home+"/.ssh", 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(home+"/.ssh/authorized_keys", []byte(keys.String()), 0o600); err != nil {
		return err
	}
	logf("ignition: user %s: %d SSH keys", u.Name, len(u.SSHAuthorizedKeys))
	return nil
}

func writeUnits(units []types.Unit) ([]unit, error) {
	var start []unit
	for _, u := range units {
		dir := "/etc/systemd/system"
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		contents := ""
		if u.Contents != nil {
			contents = *u.Contents
			if err := os.WriteFile(filepath.Join(dir, u.Name), []byte(contents), 0o644); err != nil {
				return nil, err
			}
		}
		for _, d := range u.Dropins {
			if d.Contents == nil {
				continue
			}
			if err := os.MkdirAll(filepath.Join(dir, u.Name+".d"), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(dir, u.Name+".d", d.Name), []byte(*d.Contents), 0o644); err != nil {
				return nil, err
			}
			contents += "\n" + *d.Contents
		}
		if u.Enabled == nil || !*u.Enabled || (u.Mask != nil && *u.Mask) || !strings.HasSuffix(u.Name, ".service") {
			continue
		}
		parsed, err := parseUnit(u.Name, contents)
		if err != nil {
			logf("ignition: %v", err)
			continue
		}
		start = append(start, parsed)
	}
	return start, nil
}
