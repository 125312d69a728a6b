// Package handover carries a bound host's installation from the manager,
// which may read its hosted cluster's Secrets, to the agent API, which may
// read no Secret at all (docs/security.md, "Least privilege").
//
// The manager prepares, for every bound Agent agentboot installs that has
// not started installing, a ConfigMap in agentboot's own namespace named
// after the Agent's UID: either the installation (the pointer Ignition
// with the cluster's join token and CA, and the OS disk image) sealed with
// a key only the manager and the agent API hold, or why there is none yet
// (in clear: a reason is no secret). The seal is bound to the Agent's UID
// and to a digest of everything of the Agent the installation was made
// from, so that it opens for that Agent as it is now and for nothing else.
// The agent API reads the ConfigMap when it hands out the install step;
// the manager re-reads what it was made from every refresh and rewrites it
// when anything changed (a rotated token), and deletes it once the host
// started installing or is no longer bound.
package handover

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentrecord"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/signing"
)

// Label marks the handover ConfigMaps (value "true").
const Label = "agentboot.io/install-handover"

// Keys of a handover ConfigMap.
const (
	keyInputs  = "inputs"  // Inputs of the Agent it was made for
	keySealed  = "sealed"  // the sealed Install, base64
	keyDigest  = "digest"  // a keyed digest of the Install: unchanged content is not rewritten
	keyWaiting = "waiting" // why there is no installation yet
	keyReason  = "reason"  // the event reason for it
	keyExpires = "expires" // when a sealed installation stops opening (RFC 3339)
	keyBinding = "binding" // binding.Binding.Digest of the binding it was made from
)

// Lifetime is how long a sealed installation opens: the manager seals it
// again well before (Same), so a handover outlives a manager that stopped
// looking by this much at most.
const Lifetime = 10 * time.Minute

// Install is what the agent API needs of a bound host's installation
// beyond the Agent itself.
type Install struct {
	// Ignition is the config the installed OS boots with: the hosted
	// cluster's pointer Ignition, join token included.
	Ignition string `json:"ignition"`
	// ImageURL and ImageSHA256 are the OS disk image to write.
	ImageURL    string `json:"imageURL"`
	ImageSHA256 string `json:"imageSHA256"`
	// OnRelease is the erase the host will owe when the installation is
	// forgotten: the manager's policy for the InfraEnv it registered
	// through (sanitize.Policy).
	OnRelease string `json:"onRelease"`
}

// Name is the handover ConfigMap's name for the Agent with uid.
func Name(a *v1beta1.Agent) string { return namePrefix + string(a.UID) }

const namePrefix = "install-"

// AgentUID is the UID of the Agent whose handover cm is, if it is one.
func AgentUID(cm *corev1.ConfigMap) (string, bool) {
	if cm.Labels[Label] != "true" {
		return "", false
	}
	return strings.CutPrefix(cm.Name, namePrefix)
}

// Inputs is a digest of everything of the Agent and its InfraEnv an
// installation is made from: the Agent's identity, the InfraEnv it
// registered through (its UID, architecture and OS image version pick the
// disk image), its binding (spec.clusterDeploymentName, the agentMachineRef
// label and annotation), its Ignition fields, and the hostname its Node
// gets. A handover made for other inputs is stale.
func Inputs(a *v1beta1.Agent, ie *v1beta1.InfraEnv) string {
	in := struct {
		NS, Name, UID, InfraEnvUID, Arch, Version string
		ClusterDeployment                         *v1beta1.ClusterReference
		Machine, MachineNS                        string
		Token                                     *v1beta1.IgnitionEndpointTokenReference
		Headers                                   map[string]string
		Overrides, Pool, Hostname                 string
	}{a.Namespace, a.Name, string(a.UID), string(ie.UID), ie.Spec.CPUArchitecture, ie.Spec.OSImageVersion,
		a.Spec.ClusterDeploymentName, a.Labels[lifecycle.AgentMachineRefLabel], a.Annotations[lifecycle.AgentMachineRefNamespaceAnnotation],
		a.Spec.IgnitionEndpointTokenReference, a.Spec.IgnitionEndpointHTTPHeaders,
		a.Spec.IgnitionConfigOverrides, a.Spec.MachineConfigPool, a.Hostname()}
	b, err := json.Marshal(in)
	if err != nil {
		panic(err) // strings, maps of strings and pointers to structs of them
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// aad binds a seal to the Agent, its inputs, its binding and its expiry.
func aad(a *v1beta1.Agent, inputs, binding, expires string) []byte {
	return []byte("agentboot install handover\x00" + string(a.UID) + "\x00" + a.Namespace + "/" + a.Name + "\x00" + inputs + "\x00" + binding + "\x00" + expires)
}

func base(namespace string, a *v1beta1.Agent, ie *v1beta1.InfraEnv) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: Name(a), Labels: map[string]string{Label: "true", "app.kubernetes.io/part-of": "agentboot"}},
		Data:       map[string]string{agentrecord.AgentKey: agentrecord.Of(a), keyInputs: Inputs(a, ie)},
	}
}

// Sealed is the handover of inst for a (registered through ie, bound as
// binding, a binding.Binding.Digest), in namespace, opening until
// now+Lifetime.
func Sealed(key signing.Key, namespace string, a *v1beta1.Agent, ie *v1beta1.InfraEnv, binding string, inst Install, now time.Time) (*corev1.ConfigMap, error) {
	cm := base(namespace, a, ie)
	plain, err := json.Marshal(inst)
	if err != nil {
		return nil, err
	}
	expires := now.Add(Lifetime).UTC().Format(time.RFC3339)
	sealed, err := key.Seal(plain, aad(a, cm.Data[keyInputs], binding, expires))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(plain)
	cm.Data[keySealed] = base64.StdEncoding.EncodeToString(sealed)
	cm.Data[keyExpires] = expires
	cm.Data[keyBinding] = binding
	cm.Data[keyDigest] = key.Token(signing.PurposeInstallSeal, string(a.UID), cm.Data[keyInputs]+"\x00"+hex.EncodeToString(sum[:]))
	return cm, nil
}

// Waiting is the handover saying why a has no installation yet; reason is
// the event reason the agent API reports it with.
func Waiting(namespace string, a *v1beta1.Agent, ie *v1beta1.InfraEnv, why, reason string) *corev1.ConfigMap {
	cm := base(namespace, a, ie)
	cm.Data[keyWaiting], cm.Data[keyReason] = why, reason
	return cm
}

// Same reports whether have already says what want says, so that nothing
// need be written at now: the same waiting reason, or a seal of the same
// content for the same inputs under the same key that opens for more than
// half its lifetime yet.
func Same(have, want *corev1.ConfigMap, now time.Time) bool {
	for _, k := range []string{agentrecord.AgentKey, keyInputs, keyBinding, keyDigest, keyWaiting, keyReason} {
		if have.Data[k] != want.Data[k] {
			return false
		}
	}
	if have.Labels[Label] != "true" || (have.Data[keySealed] == "") != (want.Data[keySealed] == "") {
		return false
	}
	if have.Data[keySealed] == "" {
		return true
	}
	exp, err := time.Parse(time.RFC3339, have.Data[keyExpires])
	return err == nil && exp.Sub(now) > Lifetime/2
}

// Wait is Open's error when the manager said the installation must wait,
// or refused it; it is shown to people as it is.
type Wait struct{ Msg, Reason string }

func (e *Wait) Error() string { return e.Msg }

// EventReason is the reason the manager gave (BindingRefused,
// InstallationWaiting).
func (e *Wait) EventReason() string { return e.Reason }

// ErrStale is Open's error for a handover made for an earlier state of the
// Agent (its binding, Ignition fields or hostname changed since) or
// expired (the manager has not looked at it for Lifetime): the manager
// makes a new one.
var ErrStale = errors.New("waiting for the manager to prepare the installation of the Agent as it is now")

// Open reads the handover cm for a (registered through ie) at now: the
// installation, a *Wait, ErrStale, or an error wrapping
// signing.ErrSealBroken for a seal that does not open. For a sealed
// handover it asks binding for the digest of the Agent's binding as it
// holds now (resolved afresh: a binding revoked since the handover was made
// is refused at once, with binding's error) and opens it only if the
// handover was made from that binding.
func Open(key signing.Key, cm *corev1.ConfigMap, a *v1beta1.Agent, ie *v1beta1.InfraEnv, binding func() (string, error), now time.Time) (Install, error) {
	inputs := Inputs(a, ie)
	switch {
	case cm.Labels[Label] != "true" || cm.Name != Name(a) || cm.Data[keyInputs] != inputs:
		return Install{}, ErrStale
	case cm.Data[keySealed] == "":
		why, reason := cm.Data[keyWaiting], cm.Data[keyReason]
		if why == "" {
			why = "the manager's handover of the installation says neither what to install nor why not"
		}
		if reason == "" {
			reason = "InstallationWaiting"
		}
		return Install{}, &Wait{Msg: why, Reason: reason}
	}
	exp, err := time.Parse(time.RFC3339, cm.Data[keyExpires])
	if err != nil || !now.Before(exp) {
		return Install{}, ErrStale
	}
	current, err := binding()
	if err != nil {
		return Install{}, err
	}
	if current != cm.Data[keyBinding] {
		return Install{}, ErrStale
	}
	sealed, err := base64.StdEncoding.DecodeString(cm.Data[keySealed])
	if err != nil {
		return Install{}, fmt.Errorf("handover ConfigMap %s/%s: %w", cm.Namespace, cm.Name, signing.ErrSealBroken)
	}
	plain, err := key.Open(sealed, aad(a, inputs, current, cm.Data[keyExpires]))
	if err != nil {
		return Install{}, fmt.Errorf("handover ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	var inst Install
	if err := json.Unmarshal(plain, &inst); err != nil || inst.Ignition == "" || inst.ImageURL == "" || inst.OnRelease == "" {
		return Install{}, fmt.Errorf("handover ConfigMap %s/%s: the sealed installation is incomplete", cm.Namespace, cm.Name)
	}
	return inst, nil
}
