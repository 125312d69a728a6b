package devcluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/agentboot/agentboot/internal/atomicfile"
)

// pki is the set of files the control plane needs, all under one directory.
type pki struct {
	dir string
}

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

func (p pki) caCert() string      { return p.path("ca.crt") }
func (p pki) caKey() string       { return p.path("ca.key") }
func (p pki) servingCert() string { return p.path("apiserver.crt") }
func (p pki) servingKey() string  { return p.path("apiserver.key") }
func (p pki) adminCert() string   { return p.path("admin.crt") }
func (p pki) adminKey() string    { return p.path("admin.key") }
func (p pki) saPublic() string    { return p.path("sa.pub") }
func (p pki) saPrivate() string   { return p.path("sa.key") }

// certLifetime is long enough that a kept dev state never expires in practice;
// renewBefore regenerates leaf certificates that are close to the end anyway.
const (
	certLifetime = 5 * 365 * 24 * time.Hour
	renewBefore  = 30 * 24 * time.Hour
)

// ensure creates whatever is missing or about to expire, and keeps the rest, so
// that a kubeconfig handed out by an earlier run keeps working.
func (p pki) ensure() error {
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	ca, caKey, err := p.loadPair(p.caCert(), p.caKey())
	if err != nil {
		ca, caKey, err = p.issue(p.caCert(), p.caKey(), &x509.Certificate{
			Subject:               pkix.Name{CommonName: "agentboot-dev-ca"},
			IsCA:                  true,
			BasicConstraintsValid: true,
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}, nil, nil)
		if err != nil {
			return fmt.Errorf("create CA: %w", err)
		}
		// A new CA invalidates every leaf signed by an old one.
		for _, f := range []string{p.servingCert(), p.adminCert()} {
			_ = os.Remove(f)
		}
	}
	if _, _, err := p.loadPair(p.servingCert(), p.servingKey()); err != nil {
		_, _, err = p.issue(p.servingCert(), p.servingKey(), &x509.Certificate{
			Subject:     pkix.Name{CommonName: "kube-apiserver"},
			DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP(serviceIP)},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			KeyUsage:    x509.KeyUsageDigitalSignature,
		}, ca, caKey)
		if err != nil {
			return fmt.Errorf("create apiserver serving certificate: %w", err)
		}
	}
	if _, _, err := p.loadPair(p.adminCert(), p.adminKey()); err != nil {
		_, _, err = p.issue(p.adminCert(), p.adminKey(), &x509.Certificate{
			Subject:     pkix.Name{CommonName: "agentboot-dev-admin", Organization: []string{"system:masters"}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			KeyUsage:    x509.KeyUsageDigitalSignature,
		}, ca, caKey)
		if err != nil {
			return fmt.Errorf("create admin client certificate: %w", err)
		}
	}
	if _, err := os.Stat(p.saPrivate()); err != nil {
		if err := p.writeServiceAccountKeys(); err != nil {
			return fmt.Errorf("create service account keys: %w", err)
		}
	}
	return nil
}

// loadPair reads a certificate and its key and fails when either is missing,
// unreadable or close to expiry.
func (p pki) loadPair(certFile, keyFile string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	if time.Until(cert.NotAfter) < renewBefore {
		return nil, nil, errors.New("expiring")
	}
	return cert, key, nil
}

// issue creates a key and a certificate from template, signed by parent (or
// self-signed when parent is nil), and writes both.
func (p pki) issue(certFile, keyFile string, template, parent *x509.Certificate, parentKey crypto.Signer) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, err
	}
	template.SerialNumber = serial
	template.NotBefore = time.Now().Add(-time.Hour)
	template.NotAfter = time.Now().Add(certLifetime)
	if parent == nil {
		parent, parentKey = template, key
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parent, key.Public(), parentKey)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := atomicfile.Write(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, nil, err
	}
	if err := atomicfile.Write(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func (p pki) writeServiceAccountKeys() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	priv, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	if err := atomicfile.Write(p.saPrivate(), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: priv}), 0o600); err != nil {
		return err
	}
	return atomicfile.Write(p.saPublic(), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

// ServiceCertificate returns a serving certificate, signed by the dev CA, for
// agentboot's own services at ips and names; it is reissued when they change.
func (p pki) serviceCertificate(ips []net.IP, names []string) (certFile, keyFile string, err error) {
	certFile, keyFile = p.path("services.crt"), p.path("services.key")
	ca, caKey, err := p.loadPair(p.caCert(), p.caKey())
	if err != nil {
		return "", "", fmt.Errorf("dev CA: %w", err)
	}
	if cert, _, err := p.loadPair(certFile, keyFile); err == nil && sameSANs(cert, ips, names) {
		return certFile, keyFile, nil
	}
	_, _, err = p.issue(certFile, keyFile, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "agentboot-dev-services"},
		DNSNames:    names,
		IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}, ca, caKey)
	return certFile, keyFile, err
}

func sameSANs(c *x509.Certificate, ips []net.IP, names []string) bool {
	if len(c.IPAddresses) != len(ips) || len(c.DNSNames) != len(names) {
		return false
	}
	for i := range ips {
		if !c.IPAddresses[i].Equal(ips[i]) {
			return false
		}
	}
	for i := range names {
		if c.DNSNames[i] != names[i] {
			return false
		}
	}
	return true
}
