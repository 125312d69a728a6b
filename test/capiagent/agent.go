package capiagent

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The Agent as cluster-api-provider-agent sees it: the shape of
// assisted-service's Go type (api/v1beta1 AgentSpec at the version the
// provider vendors). The provider writes Agents with full-object Updates of
// this type, so any spec field agentboot has and this type lacks
// (installation_disk_path) is dropped when it binds or unbinds; tests see
// exactly that. Status is only read here (the status subresource ignores
// it on Update).

var agentGVK = schema.GroupVersionKind{Group: "agent-install.openshift.io", Version: "v1beta1", Kind: "Agent"}

type agentReference struct {
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

type ignitionEndpointTokenReference struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

type agentSpec struct {
	ClusterDeploymentName          *agentReference                 `json:"clusterDeploymentName,omitempty"`
	Role                           string                          `json:"role"`
	Hostname                       string                          `json:"hostname,omitempty"`
	MachineConfigPool              string                          `json:"machineConfigPool,omitempty"`
	Approved                       bool                            `json:"approved"`
	InstallationDiskID             string                          `json:"installation_disk_id,omitempty"`
	InstallerArgs                  string                          `json:"installerArgs,omitempty"`
	IgnitionConfigOverrides        string                          `json:"ignitionConfigOverrides,omitempty"`
	IgnitionEndpointTokenReference *ignitionEndpointTokenReference `json:"ignitionEndpointTokenReference,omitempty"`
	IgnitionEndpointHTTPHeaders    map[string]string               `json:"ignitionEndpointHTTPHeaders,omitempty"`
	NodeLabels                     map[string]string               `json:"nodeLabels,omitempty"`
}

type agentCondition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

type agentInterface struct {
	IPV4Addresses []string `json:"ipV4Addresses"`
	HasCarrier    bool     `json:"hasCarrier,omitempty"`
}

type agentStatus struct {
	Conditions []agentCondition `json:"conditions,omitempty"`
	DebugInfo  struct {
		State string `json:"state,omitempty"`
	} `json:"debugInfo"`
	Inventory struct {
		Hostname   string           `json:"hostname,omitempty"`
		Interfaces []agentInterface `json:"interfaces,omitempty"`
	} `json:"inventory,omitempty"`
}

// Agent is assisted-service's Agent, as the provider reads and writes it.
type Agent struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              agentSpec   `json:"spec,omitempty"`
	Status            agentStatus `json:"status,omitempty"`
}

// AgentList is a list of Agents.
type AgentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Agent `json:"items"`
}

func (a *Agent) DeepCopyObject() runtime.Object     { return deepCopy(a, &Agent{}) }
func (l *AgentList) DeepCopyObject() runtime.Object { return deepCopy(l, &AgentList{}) }

func deepCopy[T runtime.Object](in, out T) runtime.Object {
	b, err := json.Marshal(in)
	if err != nil {
		panic(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}

func (a *Agent) condition(t string) *agentCondition {
	for i := range a.Status.Conditions {
		if a.Status.Conditions[i].Type == t {
			return &a.Status.Conditions[i]
		}
	}
	return nil
}

// valid is the provider's isValidAgent: approved; Bound False, Validated
// True, Connected True (a missing Bound condition makes it ineligible).
func (a *Agent) valid() bool {
	if !a.Spec.Approved {
		return false
	}
	for t, want := range map[string]string{"Bound": "False", "Validated": "True", "Connected": "True"} {
		c := a.condition(t)
		if c == nil || c.Status != want {
			return false
		}
	}
	return true
}

func addAgentTypes(s *runtime.Scheme) error {
	s.AddKnownTypeWithName(agentGVK, &Agent{})
	s.AddKnownTypeWithName(agentGVK.GroupVersion().WithKind("AgentList"), &AgentList{})
	metav1.AddToGroupVersion(s, agentGVK.GroupVersion())
	return nil
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func fromMap(m map[string]any, v any) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
