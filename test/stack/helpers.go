package stack

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/test/testenv"
)

// Namespace creates a namespace with a valid pull secret named
// "pull-secret".
func (s *Stack) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := s.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "pull-secret"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"quay.io":{"auth":"bWU6c2VjcmV0"}}}`)},
	}
	if err := s.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// NewInfraEnv returns an InfraEnv using the namespace's pull secret.
func NewInfraEnv(ns, name string) *v1beta1.InfraEnv {
	return &v1beta1.InfraEnv{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1beta1.InfraEnvSpec{
			PullSecretRef:    &corev1.LocalObjectReference{Name: "pull-secret"},
			CPUArchitecture:  v1beta1.CPUArchitectureX86_64,
			SSHAuthorizedKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITest test@agentboot",
		},
	}
}

// WaitCondition waits until the InfraEnv's ImageCreated condition has
// status and returns the InfraEnv.
func (s *Stack) WaitCondition(t testing.TB, key client.ObjectKey, status corev1.ConditionStatus, match func(*v1beta1.InfraEnv) bool) *v1beta1.InfraEnv {
	t.Helper()
	var ie v1beta1.InfraEnv
	// Generous: the first stack of a run downloads and checks the dev OS
	// images, and a loaded two-core machine under -race is slow.
	deadline := time.Now().Add(3 * time.Minute)
	var lastErr error
	for time.Now().Before(deadline) {
		if lastErr = s.Client.Get(context.Background(), key, &ie); lastErr == nil {
			c := conditions.Find(ie.Status.Conditions, v1beta1.ImageCreatedCondition)
			if c != nil && c.Status == status && (match == nil || match(&ie)) {
				return &ie
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("InfraEnv %s: ImageCreated never became %s (last read error: %v); status: %+v", key, status, lastErr, ie.Status)
	return nil
}

// WaitImage waits for ImageCreated True.
func (s *Stack) WaitImage(t testing.TB, key client.ObjectKey) *v1beta1.InfraEnv {
	t.Helper()
	return s.WaitCondition(t, key, corev1.ConditionTrue, nil)
}

// CreateInfraEnv creates InfraEnv name in a new namespace (prefix), as
// change shapes it, and waits for its image.
func (s *Stack) CreateInfraEnv(t testing.TB, prefix, name string, change func(*v1beta1.InfraEnv)) *v1beta1.InfraEnv {
	t.Helper()
	ie := NewInfraEnv(s.Namespace(t, prefix), name)
	if change != nil {
		change(ie)
	}
	if err := s.Client.Create(context.Background(), ie); err != nil {
		t.Fatal(err)
	}
	return s.WaitImage(t, client.ObjectKeyFromObject(ie))
}

// Download fetches a published URL through the loopback listener into a
// file in t's temporary directory.
func (s *Stack) Download(t testing.TB, url string) string {
	t.Helper()
	resp, err := s.HTTP.Get(s.Local(url))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := filepath.Join(t.TempDir(), "download")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// Local rewrites a published URL to the image service's loopback listener,
// for fetching from the test process.
func (s *Stack) Local(published string) string {
	u, err := url.Parse(published)
	if err != nil {
		panic(err)
	}
	switch u.Scheme {
	case "https":
		u.Host = s.HTTPSAddr
	case "http":
		u.Host = s.HTTPAddr
	}
	return u.String()
}

// Message returns the ImageCreated condition message.
func Message(ie *v1beta1.InfraEnv) string {
	if c := conditions.Find(ie.Status.Conditions, v1beta1.ImageCreatedCondition); c != nil {
		return c.Reason + ": " + c.Message
	}
	return ""
}

// Contains is a match function for WaitCondition on the message.
func Contains(sub string) func(*v1beta1.InfraEnv) bool {
	return func(ie *v1beta1.InfraEnv) bool { return strings.Contains(Message(ie), sub) }
}

// Deployed applies deploy/ (the kustomize base with its RBAC) to env and
// returns the identities of the manager's, the agent API's and the image
// service's ServiceAccounts, for Options.Identities: the stack then runs
// with exactly the rights a real cluster gives it.
func Deployed(env *testenv.Env) (ids Identities, err error) {
	return DeployedFrom(testenv.RepoRoot() + "/deploy")(env)
}

// DeployedFrom is Deployed with another kustomize directory (another
// release's deploy/).
func DeployedFrom(deploy string) func(env *testenv.Env) (Identities, error) {
	return func(env *testenv.Env) (Identities, error) { return deployedFrom(env, deploy) }
}

func deployedFrom(env *testenv.Env, deploy string) (ids Identities, err error) {
	ctx := context.Background()
	if out, err := env.Kubectl(ctx, "", "apply", "-k", deploy); err != nil {
		return ids, fmt.Errorf("apply %s: %v: %s", deploy, err, out)
	}
	identity := func(sa string) (*rest.Config, error) {
		tok, err := env.Kubectl(ctx, "", "-n", Namespace, "create", "token", sa)
		if err != nil {
			return nil, fmt.Errorf("token of %s: %w", sa, err)
		}
		cfg := rest.AnonymousClientConfig(env.Config)
		cfg.BearerToken = strings.TrimSpace(tok)
		return cfg, nil
	}
	if ids.Manager, err = identity("agentboot-manager"); err != nil {
		return ids, err
	}
	if ids.AgentAPI, err = identity("agentboot-agent-api"); err != nil {
		return ids, err
	}
	ids.ImageService, err = identity("agentboot-image-service")
	return ids, err
}

// Validation is the Agent's validation with id, or the zero result.
func Validation(a *v1beta1.Agent, id string) v1beta1.ValidationResult {
	for _, vs := range a.Status.ValidationsInfo {
		for _, v := range vs {
			if v.ID == id {
				return v
			}
		}
	}
	return v1beta1.ValidationResult{}
}
