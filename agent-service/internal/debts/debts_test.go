package debts

import (
	"testing"

	"github.com/stretchr/testify/require"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
)

// Placeholders that firmware, virtual disks and drives that travel between
// machines ship are no mark of a machine: two machines sharing one must not
// share a debt.
func TestMarksLeaveOutPlaceholders(t *testing.T) {
	a := &v1beta1.Agent{}
	a.Name = "03000200-0400-0500-0006-000700080009"
	a.Status.Inventory.SystemVendor.SerialNumber = "To Be Filled By O.E.M."
	a.Status.Inventory.Interfaces = []v1beta1.HostInterface{{MacAddress: "00:00:00:00:00:00"}}
	require.Empty(t, AgentMarks(a))

	a.Name = "4c4c4544-0042-4810-8056-b4c04f595231"
	a.Status.Inventory.SystemVendor.SerialNumber = " CZ2D1X0ABC "
	a.Status.Inventory.Interfaces = []v1beta1.HostInterface{{MacAddress: "52:54:00:AB:CD:EF"}}
	require.Equal(t, []string{Mark("uuid", "4c4c4544-0042-4810-8056-b4c04f595231"), Mark("serial", "CZ2D1X0ABC"), Mark("mac", "52:54:00:ab:cd:ef")}, AgentMarks(a))

	require.Equal(t, []string{Mark("disk", "S3Z8NB0K123456"), Mark("disk", "0x5002538e40a1b2c3")}, DiskMarks([]v1beta1.HostDisk{
		{Serial: "0"},
		{Serial: "QM00001", DriveType: "HDD"},
		{Serial: "S3Z8NB0K123456", Wwn: "0x5002538E40A1B2C3"},
		{Wwn: "-"},
		{Serial: "VIRTUAL-CD-0001", DriveType: "ODD"},
		{Serial: "USB-STICK-1234", InstallationEligibility: v1beta1.HostInstallationEligibility{NotEligibleReasons: []string{agentwire.DiskRemovable}}},
	}))
}
