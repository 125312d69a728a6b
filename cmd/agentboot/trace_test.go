package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

// `agentboot trace` shows a host's boot path by MAC or by Agent, where it
// stopped and why, with the reader's own rights: a tenant reads its own
// hosts' traces, is told what it may not read, and never sees the traces
// of MACs nothing claims; an operator sees those, marked as such.
func TestTraceCommand(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	fetch := func(u string) {
		t.Helper()
		resp, err := s.HTTP.Get(s.Local(u))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, u)
	}
	stranger := "52:54:00:00:88:01"
	fetch(s.Settings.ImageServiceHTTPURL + "/boot.ipxe?mac=" + url.QueryEscape(stranger))
	// Written before an InfraEnv claims every MAC: a trace lives where its
	// MAC is claimed when it is written.
	require.Eventually(t, func() bool {
		var bt v1alpha1.BootTrace
		return s.Client.Get(ctx, client.ObjectKey{Namespace: stack.Namespace, Name: boottrace.Name(stranger)}, &bt) == nil
	}, 30*time.Second, 100*time.Millisecond)
	ie := s.CreateInfraEnv(t, "team", "pool", func(ie *v1beta1.InfraEnv) { ie.Labels = map[string]string{v1beta1.PXEDefaultLabel: "true"} })
	ie = s.WaitImage(t, client.ObjectKeyFromObject(ie))
	mac := stack.MAC(1)
	fetch(s.Settings.ImageServiceHTTPURL + "/boot.ipxe?mac=" + url.QueryEscape(mac))
	for _, u := range []string{ie.Status.BootArtifacts.KernelURL, ie.Status.BootArtifacts.InitrdURL, ie.Status.BootArtifacts.RootfsURL} {
		fetch(u)
	}
	var traces v1alpha1.BootTraceList
	require.Eventually(t, func() bool {
		var bt v1alpha1.BootTrace
		require.NoError(t, s.Client.List(ctx, &traces))
		return s.Client.Get(ctx, client.ObjectKey{Namespace: ie.Namespace, Name: boottrace.Name(mac)}, &bt) == nil && bt.Status.LastHop == boottrace.RootFS
	}, 30*time.Second, 100*time.Millisecond, "%+v", &traces.Items)

	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		require.NoError(t, traceCommand(ctx, args, &out))
		t.Logf("agentboot trace %v:\n%s", args, out.String())
		return out.String()
	}

	// The operator.
	out := run("--kubeconfig", s.Env.Kubeconfig, mac)
	require.Contains(t, out, "boots InfraEnv "+ie.Namespace+"/"+ie.Name)
	require.Regexp(t, `rootfs\s+\S+\s+yes\s+image-service\s+1\s+sent, \d+ bytes \(rootfs.img from 127.0.0.1\)`, out)
	require.Contains(t, out, "Stopped at: rootfs")
	require.Contains(t, out, "Likely: the live system booted and its agent never registered")
	out = run("--kubeconfig", s.Env.Kubeconfig, stranger)
	require.Contains(t, out, "not claimed by any InfraEnv: unknown: no BareMetalHost has boot MAC "+stranger)
	require.Contains(t, out, "Stopped at: boot_script")

	// The host registers: by its Agent, the path goes on.
	h := s.Register(t, ie, 1)
	require.Eventually(t, func() bool {
		var a v1beta1.Agent
		return s.Client.Get(ctx, client.ObjectKey{Namespace: h.NS, Name: h.ID}, &a) == nil && a.Status.Inventory.ReportTime != nil
	}, 30*time.Second, 100*time.Millisecond)
	out = run("--kubeconfig", s.Env.Kubeconfig, "-n", h.NS, h.ID)
	require.Contains(t, out, "Agent "+h.NS+"/"+h.ID)
	require.Regexp(t, `registered\s+\S+\s+yes\s+agent-api`, out)
	require.Regexp(t, `inventory\s+\S+\s+yes\s+agent-api`, out)

	// A tenant who may view its namespace (the aggregated view role's
	// rules: envtest runs no controller-manager to aggregate them).
	_, err := s.Env.Kubectl(ctx, "", "apply", "-f", filepath.Join(testenv.RepoRoot(), "deploy", "rbac", "view.yaml"))
	require.NoError(t, err)
	require.NoError(t, s.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: "agents-view"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1beta1.GroupVersion.Group}, Resources: []string{"agents"}, Verbs: []string{"get", "list", "watch"}}}}))
	for kind, name := range map[string]string{"Role": "agents-view", "ClusterRole": "agentboot-boottraces-view"} {
		require.NoError(t, s.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, GenerateName: "alice-"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}}}))
	}
	alice, err := s.Env.UserKubeconfig("alice")
	require.NoError(t, err)
	var last string
	require.Eventually(t, func() bool {
		var out bytes.Buffer
		err := traceCommand(ctx, []string{"--kubeconfig", alice, "-n", ie.Namespace, mac}, &out)
		last = fmt.Sprint(err, out.String())
		return err == nil && bytes.Contains(out.Bytes(), []byte("Reached:"))
	}, 10*time.Second, 200*time.Millisecond, "RBAC takes effect: %s", &last)
	out = run("--kubeconfig", alice, "-n", ie.Namespace, mac)
	require.Contains(t, out, "trace: BootTrace "+ie.Namespace+"/"+boottrace.Name(mac))
	require.Contains(t, out, "Agent "+h.NS+"/"+h.ID)
	require.Contains(t, out, "not readable with your rights: BootTraces in other namespaces")
	out = run("--kubeconfig", alice, "-n", ie.Namespace, stranger)
	require.Contains(t, out, "no boot trace")
	require.NotContains(t, out, "unknown: no BareMetalHost", "the unclaimed trace stays the operator's")

	// Someone with no rights reads nothing, and is told so.
	bob, err := s.Env.UserKubeconfig("bob")
	require.NoError(t, err)
	out = run("--kubeconfig", bob, "-n", ie.Namespace, mac)
	require.Contains(t, out, "no boot trace")
	require.Contains(t, out, "not readable with your rights: BootTraces in other namespaces; BootTraces in namespace "+ie.Namespace+"; Agents in namespace "+ie.Namespace)
	var buf bytes.Buffer
	require.ErrorContains(t, traceCommand(ctx, []string{"--kubeconfig", bob, "-n", ie.Namespace, h.ID}, &buf), "forbidden")
	require.ErrorContains(t, traceCommand(ctx, []string{"--kubeconfig", s.Env.Kubeconfig, "not-a-mac"}, &buf), "no Agent not-a-mac in namespace default",
		"not a MAC: an Agent of the kubeconfig's namespace")
}
