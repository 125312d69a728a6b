package debts

import (
	"testing"

	"github.com/stretchr/testify/require"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
)

// Placeholders that firmware and virtual disks ship are no mark of a
// machine: two machines sharing one must not share a debt.
func TestMarksLeaveOutPlaceholders(t *testing.T) {
	require.Empty(t, IdentityMarks(agentwire.HostIdentity{
		SystemUUID: "03000200-0400-0500-0006-000700080009", SerialNumber: "To Be Filled By O.E.M.",
		MACAddresses: []string{"00:00:00:00:00:00"},
	}))
	require.Equal(t, []string{Mark("uuid", "4c4c4544-0042-4810-8056-b4c04f595231"), Mark("serial", "CZ2D1X0ABC"), Mark("mac", "52:54:00:ab:cd:ef")},
		IdentityMarks(agentwire.HostIdentity{SystemUUID: "4C4C4544-0042-4810-8056-B4C04F595231", SerialNumber: " CZ2D1X0ABC ", MACAddresses: []string{"52:54:00:AB:CD:EF"}}))
	require.Equal(t, []string{Mark("disk", "S3Z8NB0K123456"), Mark("disk", "0x5002538e40a1b2c3")},
		DiskMarks([]v1beta1.HostDisk{{Serial: "0"}, {Serial: "S3Z8NB0K123456", Wwn: "0x5002538E40A1B2C3"}, {Wwn: "-"}}))
	// What a registration and an inventory say of the same machine meet.
	a := &v1beta1.Agent{}
	a.Name = "4c4c4544-0042-4810-8056-b4c04f595231"
	a.Status.Inventory.Interfaces = []v1beta1.HostInterface{{MacAddress: "52:54:00:ab:cd:ef"}}
	require.Subset(t, AgentMarks(a), IdentityMarks(agentwire.HostIdentity{SystemUUID: a.Name, MACAddresses: []string{"52:54:00:ab:cd:ef"}}))
}
