// Package bmc is agentboot's BareMetalHost controller, in place of metal3's
// baremetal-operator and Ironic: it drives servers' BMCs with bmclib (IPMI
// through ipmitool, Redfish through gofish), keeps their power as
// spec.online says, boots the hosts labelled with an InfraEnv into discovery
// (the InfraEnv ISO as virtual media, or PXE) and approves the Agent that
// registers from each host's boot MAC. It writes BareMetalHost status and
// finalizers and Agent labels and spec; it never writes a BareMetalHost's
// spec, and it never touches hosts marked paused or detached.
package bmc
