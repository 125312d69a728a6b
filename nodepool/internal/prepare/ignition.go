package prepare

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_2/types"
	"github.com/vincent-petithory/dataurl"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hiveext "github.com/agentboot/agentboot/api/hiveext/v1beta1"
	"github.com/agentboot/agentboot/internal/binding"
	"github.com/agentboot/agentboot/internal/discovery"
)

// Keys of the Secrets a pointer Ignition is built from.
const (
	// TokenKey holds the Ignition endpoint's token in the Secret
	// spec.ignitionEndpointTokenReference names (cluster-api-provider-agent
	// writes it: the text after "Bearer " in the user-data).
	TokenKey = "ignition-token"
	// CAKey holds the Ignition endpoint's CA in the Secret the
	// AgentClusterInstall's ignitionEndpoint.caCertificateReference names.
	CAKey = corev1.TLSCertKey
	// DefaultPool is the machine config pool a host joins when
	// spec.machineConfigPool is empty.
	DefaultPool = "worker"
)

// headerName is an HTTP field name (RFC 9110 token).
var headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// poolName is a machine config pool: one path segment.
var poolName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

// PointerIgnition is the Ignition config (spec 3.2.0) of a day-2 worker:
// one merge source, the AgentClusterInstall's ignitionEndpoint URL joined
// with the Agent's machine config pool (default worker), with the bearer
// token from the Agent's token Secret, the Agent's extra HTTP headers and
// the endpoint's CA; /etc/hostname set to the Agent's hostname, so that its
// Node is named like the Agent (cluster-api-provider-agent finds the Node by
// that name); and spec.ignitionConfigOverrides merged.
func PointerIgnition(ctx context.Context, r client.Reader, a *v1beta1.Agent, b *binding.Binding) (string, error) {
	ie := b.Install.Spec.IgnitionEndpoint
	aci := b.Install.Namespace + "/" + b.Install.Name
	if ie == nil || ie.URL == "" {
		return "", &binding.Refused{Msg: fmt.Sprintf("AgentClusterInstall %s has no spec.ignitionEndpoint.url: nothing to point the host at", aci)}
	}
	base, err := url.Parse(ie.URL)
	if err != nil || base.Scheme != "https" || base.Host == "" || base.User != nil {
		// Plain http would carry the hosted cluster's join token in the
		// clear across the boot network; HyperShift's endpoint is https.
		return "", &binding.Refused{Msg: fmt.Sprintf("AgentClusterInstall %s: spec.ignitionEndpoint.url %q is not an https URL (without credentials): the pointer config carries the cluster's join token", aci, ie.URL)}
	}
	pool := a.Spec.MachineConfigPool
	if pool == "" {
		pool = DefaultPool
	}
	if !poolName.MatchString(pool) {
		return "", &binding.Refused{Msg: fmt.Sprintf("spec.machineConfigPool %q is not a machine config pool name", pool)}
	}
	hostname := a.Hostname()
	if hostname == "" {
		return "", &binding.Refused{Msg: "the host has no hostname yet"}
	}
	source := base.JoinPath(pool).String()

	token, err := endpointToken(ctx, r, a, b.Namespace)
	if err != nil {
		return "", err
	}
	headers := types.HTTPHeaders{{Name: "Authorization", Value: ptr("Bearer " + token)}}
	for _, name := range sortedKeys(a.Spec.IgnitionEndpointHTTPHeaders) {
		value := a.Spec.IgnitionEndpointHTTPHeaders[name]
		switch {
		case !headerName.MatchString(name):
			return "", &binding.Refused{Msg: fmt.Sprintf("spec.ignitionEndpointHTTPHeaders: %q is not an HTTP header name", name)}
		case strings.EqualFold(name, "Authorization"):
			return "", &binding.Refused{Msg: "spec.ignitionEndpointHTTPHeaders must not set Authorization: the token comes from spec.ignitionEndpointTokenReference"}
		case strings.ContainsAny(value, "\r\n\x00"):
			return "", &binding.Refused{Msg: fmt.Sprintf("spec.ignitionEndpointHTTPHeaders[%s] holds a line break or NUL", name)}
		}
		headers = append(headers, types.HTTPHeader{Name: name, Value: ptr(value)})
	}
	cfg := types.Config{Ignition: types.Ignition{
		Version: "3.2.0",
		Config:  types.IgnitionConfig{Merge: []types.Resource{{Source: &source, HTTPHeaders: headers}}},
	}}
	if ie.CaCertificateReference != nil {
		if ns := ie.CaCertificateReference.Namespace; ns != b.Namespace {
			// HyperShift keeps it there (ignition-server-ca-cert); a CA
			// from anywhere else could point the host at another server.
			return "", &binding.Refused{Msg: fmt.Sprintf("AgentClusterInstall %s: the ignition endpoint's CA Secret is in namespace %q; it must be in the control-plane namespace %q", aci, ns, b.Namespace)}
		}
		ca, err := endpointCA(ctx, r, *ie.CaCertificateReference, aci)
		if err != nil {
			return "", err
		}
		cfg.Ignition.Security.TLS.CertificateAuthorities = []types.Resource{{Source: ptr(dataurl.New(ca, "text/plain").String())}}
	}
	cfg.Storage.Files = []types.File{{
		Node: types.Node{Path: "/etc/hostname", Overwrite: ptr(true)},
		FileEmbedded1: types.FileEmbedded1{Mode: ptr(0o644),
			Contents: types.Resource{Source: ptr(dataurl.New([]byte(hostname+"\n"), "text/plain").String())}},
	}}
	out, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	if o := a.Spec.IgnitionConfigOverrides; o != "" {
		if err := overrideKeepsTheFetch(o); err != nil {
			return "", err
		}
		if out, err = discovery.MergeOverride("spec.ignitionConfigOverrides", out, []byte(o)); err != nil {
			return "", &binding.Refused{Msg: err.Error()}
		}
	}
	return string(out), nil
}

// overrideKeepsTheFetch refuses Agent overrides that change how the host
// fetches its cluster's config: ignition.config (other sources), .proxy (a
// proxy of the override's choosing) and .security (a CA it trusts, to read
// the join token on the way). Whoever may edit the Agent need not be whoever
// owns the cluster it is bound to. Files, units, users and the rest merge
// as given.
func overrideKeepsTheFetch(o string) error {
	var cfg struct {
		Ignition map[string]json.RawMessage `json:"ignition"`
	}
	if err := json.Unmarshal([]byte(o), &cfg); err != nil {
		return &binding.Refused{Msg: fmt.Sprintf("spec.ignitionConfigOverrides is not valid JSON: %v", err)}
	}
	for _, key := range []string{"config", "proxy", "security"} {
		if _, ok := cfg.Ignition[key]; ok {
			return &binding.Refused{Msg: fmt.Sprintf("spec.ignitionConfigOverrides sets ignition.%s: an override may not change where or how the host fetches its cluster's config, which carries the cluster's join token", key)}
		}
	}
	return nil
}

// endpointToken reads the Ignition endpoint token from the Secret the
// Agent's spec.ignitionEndpointTokenReference names, which must be in the
// control-plane namespace ns: cluster-api-provider-agent writes it there,
// next to the NodePool's user-data.
func endpointToken(ctx context.Context, r client.Reader, a *v1beta1.Agent, ns string) (string, error) {
	ref := a.Spec.IgnitionEndpointTokenReference
	switch {
	case ref == nil:
		return "", &binding.Refused{Msg: "spec.ignitionEndpointTokenReference is not set: the Machine had no bootstrap data when the Agent was bound"}
	case ref.Namespace != ns:
		return "", &binding.Refused{Msg: fmt.Sprintf("spec.ignitionEndpointTokenReference names namespace %q; the token must be in the control-plane namespace %q", ref.Namespace, ns)}
	}
	var s corev1.Secret
	if err := r.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &s); err != nil {
		return "", secretError(err, "token Secret %s/%s", ref.Namespace, ref.Name)
	}
	token := string(s.Data[TokenKey])
	if token == "" || strings.ContainsAny(token, "\r\n\x00 ") {
		return "", &binding.Refused{Msg: fmt.Sprintf("token Secret %s/%s has no usable key %q", ref.Namespace, ref.Name, TokenKey)}
	}
	return token, nil
}

// endpointCA reads the PEM CA bundle of the Ignition endpoint.
func endpointCA(ctx context.Context, r client.Reader, ref hiveext.CaCertificateReference, aci string) ([]byte, error) {
	var s corev1.Secret
	if err := r.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &s); err != nil {
		return nil, secretError(err, "CA Secret %s/%s of AgentClusterInstall %s", ref.Namespace, ref.Name, aci)
	}
	ca := s.Data[CAKey]
	rest, n := ca, 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if _, err := x509.ParseCertificate(block.Bytes); block.Type != "CERTIFICATE" || err != nil {
			n = 0
			break
		}
		n++
	}
	if n == 0 {
		return nil, &binding.Refused{Msg: fmt.Sprintf("CA Secret %s/%s of AgentClusterInstall %s: key %q is not a PEM certificate bundle", ref.Namespace, ref.Name, aci, CAKey)}
	}
	return ca, nil
}

// secretError names a missing Secret as a Refused; other errors are the
// apiserver's and are retried.
func secretError(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	if apierrors.IsNotFound(err) {
		return &binding.Refused{Msg: what + " does not exist"}
	}
	return fmt.Errorf("read %s: %w", what, err)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func ptr[T any](v T) *T { return &v }
