// Package bmcsim holds agentboot's BMC test doubles: a Redfish service
// written here (no Redfish emulator is packaged for Debian) and a harness
// around the real IPMI BMC simulator, ipmi_sim. Both drive a Machine: an
// in-memory one for controller tests, a qemu VM (test/vm) in the VM lab.
package bmcsim

import (
	"fmt"
	"sync"
)

// Boot devices a Machine boots from on power-on.
const (
	BootDefault = ""      // the machine's own order (its disk)
	BootPXE     = "pxe"   // the network
	BootCDROM   = "cdrom" // the inserted virtual CD
)

// Machine is the server behind a simulated BMC.
type Machine interface {
	// PowerOn starts the machine, booting from dev once; cdrom is the
	// local path of the inserted virtual media ("" when none).
	PowerOn(dev, cdrom string) error
	// PowerOff stops it at once.
	PowerOff() error
	// On reports whether it runs (a VM may also stop by itself).
	On() bool
}

// MemMachine is a Machine that only remembers what happened.
type MemMachine struct {
	mu    sync.Mutex
	on    bool
	boots []string
}

// PowerOn implements Machine.
func (m *MemMachine) PowerOn(dev, cdrom string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on = true
	m.boots = append(m.boots, fmt.Sprintf("%s %s", dev, cdrom))
	return nil
}

// PowerOff implements Machine.
func (m *MemMachine) PowerOff() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on = false
	return nil
}

// On implements Machine.
func (m *MemMachine) On() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.on
}

// Boots lists every power-on as "<device> <cdrom>".
func (m *MemMachine) Boots() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.boots...)
}
