package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// sbom is the CycloneDX bill of materials of one platform's image: the Go
// modules in each of its binaries (from their build information) and the
// Debian packages it took files from (with their purls).
func sbom(o buildOptions, arch string, img v1.Image, used []pkg) (sbomFile, error) {
	digest, err := img.Digest()
	if err != nil {
		return sbomFile{}, err
	}
	bom := cdx.NewBOM()
	sum := sha256.Sum256([]byte(digest.String()))
	bom.SerialNumber = fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
	bom.Metadata = &cdx.Metadata{
		Timestamp: o.epoch.Format(time.RFC3339),
		Component: &cdx.Component{Type: cdx.ComponentTypeContainer, Name: "agentboot", Version: o.version,
			BOMRef: "agentboot@" + digest.String(), PackageURL: fmt.Sprintf("pkg:oci/agentboot@%s?arch=%s", digest, arch)},
	}
	seen := map[string]bool{}
	var comps []cdx.Component
	for _, b := range []string{"agentboot-linux-" + arch, "agent", "agent-arm64"} {
		info, err := buildinfo.ReadFile(filepath.Join(o.bin, b))
		if err != nil {
			return sbomFile{}, fmt.Errorf("%s: %w", b, err)
		}
		for _, m := range info.Deps {
			if m.Replace != nil {
				m = m.Replace
			}
			purl := "pkg:golang/" + m.Path + "@" + m.Version
			if seen[purl] {
				continue
			}
			seen[purl] = true
			comps = append(comps, cdx.Component{Type: cdx.ComponentTypeLibrary, Name: m.Path, Version: m.Version, PackageURL: purl, BOMRef: purl})
		}
		purl := "pkg:golang/" + info.Main.Path + "@" + o.version
		if !seen[purl] {
			seen[purl] = true
			comps = append(comps, cdx.Component{Type: cdx.ComponentTypeApplication, Name: info.Main.Path, Version: o.version, PackageURL: purl, BOMRef: purl})
		}
	}
	for _, p := range used {
		purl := fmt.Sprintf("pkg:deb/debian/%s@%s?arch=%s", p.Name, p.Version, p.Arch)
		comps = append(comps, cdx.Component{Type: cdx.ComponentTypeLibrary, Name: p.Name, Version: p.Version, PackageURL: purl, BOMRef: purl,
			Hashes: &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: p.SHA256}}})
	}
	sort.Slice(comps, func(i, j int) bool { return comps[i].BOMRef < comps[j].BOMRef })
	bom.Components = &comps
	var b bytes.Buffer
	enc := cdx.NewBOMEncoder(&b, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.Encode(bom); err != nil {
		return sbomFile{}, err
	}
	return sbomFile{name: "sbom-linux-" + arch + ".cdx.json", data: b.Bytes()}, nil
}

// archive writes the layout as an oci-archive (skopeo's oci-archive:,
// podman load), its entries in path order with the epoch's time.
func archive(dir, to string, epoch time.Time) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	f, err := os.Create(to)
	if err != nil {
		return err
	}
	defer f.Close()
	w := tar.NewWriter(f)
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}
		if info.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			if err := w.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		if err := w.WriteHeader(h); err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	return f.Close()
}
