// Package agentwire is the contract between the on-host agent and agentboot's
// services: the agent's configuration file (written by the discovery
// Ignition) and the JSON messages of the agent API. It imports nothing from
// Kubernetes, so the agent binary stays small.
package agentwire

// ConfigPath is where the discovery Ignition writes the agent's config.
const ConfigPath = "/etc/agentboot/agent.json"

// Config is the agent's configuration.
type Config struct {
	// APIURL is the base URL of the agent API (HTTPS).
	APIURL string `json:"apiURL"`
	// InfraEnv the host registers into.
	InfraEnv InfraEnvRef `json:"infraEnv"`
	// RegistrationToken authorises registration into that InfraEnv.
	RegistrationToken string `json:"registrationToken"`
	// CABundle (PEM) verifies the agent API's certificate; empty means the
	// system trust store.
	CABundle string `json:"caBundle,omitempty"`
	// Proxy for the agent's own requests.
	Proxy *Proxy `json:"proxy,omitempty"`
	// NTPSources the agent adds to the host's time synchronisation.
	NTPSources []string `json:"ntpSources,omitempty"`
}

// InfraEnvRef names an InfraEnv.
type InfraEnvRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// Proxy is an HTTP proxy configuration.
type Proxy struct {
	HTTPProxy  string `json:"httpProxy,omitempty"`
	HTTPSProxy string `json:"httpsProxy,omitempty"`
	NoProxy    string `json:"noProxy,omitempty"`
}

// StaticNetwork is one NMStateConfig as the discovery Ignition ships it.
type StaticNetwork struct {
	// Name of the NMStateConfig.
	Name string `json:"name"`
	// Interfaces maps the names used in State to MAC addresses.
	Interfaces []StaticInterface `json:"interfaces"`
	// State is the nmstate document, as JSON.
	State map[string]any `json:"state"`
}

// StaticInterface maps one logical interface name to a MAC address.
type StaticInterface struct {
	Name       string `json:"name"`
	MACAddress string `json:"macAddress"`
}
