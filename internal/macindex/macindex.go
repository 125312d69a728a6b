// Package macindex owns the informer-cache indexes that find Agents and
// BareMetalHosts by MAC address. The image service and the BareMetalHost
// controller both look hosts up this way and can run in one manager (`make
// run`), so the indexes are registered once per manager here; nothing else
// registers them.
package macindex

import (
	"context"
	"strings"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
)

// Index names, for client.MatchingFields. Values are lowercased MACs.
const (
	// AgentMAC indexes Agents by the MAC of every inventory interface.
	AgentMAC = "agentboot.status.inventory.macAddresses"
	// BootMAC indexes BareMetalHosts by spec.bootMACAddress.
	BootMAC = "agentboot.spec.bootMACAddress"
)

// Indexer is the part of a controller-runtime manager that registers
// indexes (mgr.GetFieldIndexer()).
type Indexer = client.FieldIndexer

type key struct {
	idx   Indexer
	index string
}

var registered sync.Map // key → *once

type once struct {
	sync.Once
	err error
}

func register(idx Indexer, obj client.Object, index string, f client.IndexerFunc) error {
	v, _ := registered.LoadOrStore(key{idx, index}, &once{})
	o := v.(*once)
	o.Do(func() { o.err = idx.IndexField(context.Background(), obj, index, f) })
	return o.err
}

// Register adds both indexes to idx once; later calls with the same idx
// return the first result.
func Register(idx Indexer) error {
	if err := register(idx, &v1beta1.Agent{}, AgentMAC, AgentMACs); err != nil {
		return err
	}
	return RegisterHosts(idx)
}

// RegisterHosts adds the BareMetalHost index alone (the image service,
// which reads no Agent).
func RegisterHosts(idx Indexer) error {
	return register(idx, &metal3.BareMetalHost{}, BootMAC, HostBootMAC)
}

// AgentMACs is the AgentMAC index function.
func AgentMACs(o client.Object) []string {
	a, ok := o.(*v1beta1.Agent)
	if !ok {
		return nil
	}
	var macs []string
	for _, i := range a.Status.Inventory.Interfaces {
		if i.MacAddress != "" {
			macs = append(macs, strings.ToLower(i.MacAddress))
		}
	}
	return macs
}

// HostBootMAC is the BootMAC index function.
func HostBootMAC(o client.Object) []string {
	h, ok := o.(*metal3.BareMetalHost)
	if !ok || h.Spec.BootMACAddress == "" {
		return nil
	}
	return []string{strings.ToLower(h.Spec.BootMACAddress)}
}
