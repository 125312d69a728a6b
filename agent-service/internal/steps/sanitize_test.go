package steps

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/agent-service/internal/hostapi"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/sanitize"
	"github.com/agentboot/agentboot/test/testenv"
)

// A host that came back from a cluster owes a sanitization: it gets the
// step once per boot, its progress is shown, and only evidence that covers
// every disk it was given, each erased by a method that gives the level
// and checked (or spared as the boot medium its inventory shows), ends the
// quarantine. Anything else fails the attempt with the reason, and a new
// boot tries again.
func TestSanitizeStep(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "agents"}}))
	rec := events.NewFakeRecorder(100)
	s := &Steps{Client: env.Client, APIReader: env.Client, Events: rec, Log: logr.Discard(), Now: time.Now}

	vda := agentwire.DiskSanitization{Disk: "/dev/vda", Method: "overwrite", Bytes: 20e9, DurationSeconds: 100, Verification: "sampled-reads-zero", Checked: "256 sampled 64 KiB blocks read back as zeros (read with O_DIRECT)"}
	sr0 := agentwire.DiskSanitization{Disk: "/dev/sr0", Method: "skip", Why: "the host booted from this device"}
	n := 0
	boot1 := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	owing := func(t *testing.T, session string) *v1beta1.Agent {
		t.Helper()
		n++
		a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: fmt.Sprintf("00000000-0000-4000-8000-%012d", n)},
			Spec: v1beta1.AgentSpec{Approved: true}}
		require.NoError(t, env.Client.Create(ctx, a))
		now := metav1.Now()
		a.Status.Inventory = v1beta1.HostInventory{ReportTime: &now, Disks: []v1beta1.HostDisk{
			{ID: "/dev/disk/by-path/pci-0000:00:04.0", Path: "/dev/vda", DriveType: "HDD", SizeBytes: 20e9, InstallationEligibility: v1beta1.HostInstallationEligibility{Eligible: true, NotEligibleReasons: []string{}}},
			{ID: "/dev/sr0", Path: "/dev/sr0", DriveType: "ODD", InstallationEligibility: v1beta1.HostInstallationEligibility{NotEligibleReasons: []string{agentwire.DiskOptical}}},
		}}
		a.Status.DiskSanitization = &v1beta1.AgentDiskSanitization{Required: "erase", Reason: "it left a cluster", State: v1beta1.SanitizationPending}
		a.Status.Registration = &v1beta1.AgentRegistration{SessionStarted: session}
		require.NoError(t, env.Client.Status().Update(ctx, a))
		return a
	}
	get := func(t *testing.T, a *v1beta1.Agent) *v1beta1.Agent {
		t.Helper()
		got := &v1beta1.Agent{}
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), got))
		return got
	}
	next := func(t *testing.T, a *v1beta1.Agent) []agentwire.Step {
		t.Helper()
		steps, err := s.Next(ctx, &hostapi.AgentRef{Agent: get(t, a), InfraEnv: &v1beta1.InfraEnv{}})
		require.NoError(t, err)
		return steps
	}
	result := func(t *testing.T, a *v1beta1.Agent, r agentwire.StepResult) error {
		t.Helper()
		return s.Result(ctx, &hostapi.AgentRef{Agent: get(t, a), InfraEnv: &v1beta1.InfraEnv{}}, SanitizeStepID, r)
	}

	newBoot := func(t *testing.T, a *v1beta1.Agent) {
		t.Helper()
		reboot := get(t, a)
		patch := client.MergeFrom(reboot.DeepCopy())
		reboot.Status.Registration.SessionStarted = time.Now().Add(time.Second).UTC().Format(time.RFC3339)
		require.NoError(t, env.Client.Status().Patch(ctx, reboot, patch))
	}
	inventoried := func(t *testing.T, a *v1beta1.Agent) {
		t.Helper()
		cur := get(t, a)
		later := metav1.NewTime(time.Now().Add(2 * time.Second))
		cur.Status.Inventory.ReportTime = &later
		require.NoError(t, env.Client.Status().Update(ctx, cur))
	}

	t.Run("evidence ends the quarantine", func(t *testing.T) {
		a := owing(t, boot1)
		steps := next(t, a)
		require.Equal(t, []agentwire.Step{{ID: SanitizeStepID, Kind: agentwire.StepSanitize, Sanitize: &agentwire.SanitizeStep{Level: "erase", Disks: []string{"/dev/vda", "/dev/sr0"}}}}, steps)
		require.Len(t, next(t, a), 1, "a host asking for instructions is not running its step (result lost, agent restarted): handed again")
		ds := get(t, a).Status.DiskSanitization
		require.Equal(t, v1beta1.SanitizationRunning, ds.State)
		require.Equal(t, boot1, ds.Session)
		require.True(t, lifecycle.SanitizationOwed(get(t, a)))

		require.NoError(t, s.Progress(ctx, &hostapi.AgentRef{Agent: get(t, a)}, agentwire.Progress{Stage: agentwire.StageSanitizing, Percentage: 45, Info: "disk 1 of 2, /dev/vda: 9000 of 19073 MiB"}))
		require.Equal(t, "45%: disk 1 of 2, /dev/vda: 9000 of 19073 MiB", get(t, a).Status.DiskSanitization.Message)

		require.NoError(t, result(t, a, agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{vda, sr0}}))
		got := get(t, a)
		require.False(t, lifecycle.SanitizationOwed(got))
		ds = got.Status.DiskSanitization
		require.Equal(t, v1beta1.SanitizationDone, ds.State)
		require.Equal(t, "erase", ds.Level)
		require.Equal(t, []v1beta1.DiskSanitizationRecord{
			{Disk: "/dev/vda", Method: "overwrite", Bytes: 20e9, Duration: metav1.Duration{Duration: 100 * time.Second}, Verification: vda.Verification, Checked: vda.Checked},
			{Disk: "/dev/sr0", Method: "skip", Why: sr0.Why},
		}, ds.Disks)
		require.Contains(t, ds.Message, "/dev/vda overwrite, 20000000000 bytes in 1m40s, checked; /dev/sr0 spared (the host booted from this device)")
		require.NotNil(t, ds.CompletionTime)
		require.Empty(t, next(t, a), "nothing is owed any more")
		require.Error(t, result(t, a, agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{vda, sr0}}), "a second report is refused")
	})

	unchecked := vda
	unchecked.Checked = ""
	skipped := vda
	skipped.Method, skipped.Why, skipped.Verification, skipped.Checked = "skip", "the host booted from this device", "", ""
	short := vda
	short.Bytes = 1e9
	wrongCheck := vda
	wrongCheck.Verification = string(sanitize.ReadsChanged)
	failed := vda
	failed.Error = "disk /dev/vda: verify overwrite: byte 4096 reads 0x5a, not zero"
	for name, tc := range map[string]struct {
		r    agentwire.StepResult
		want string
	}{
		"a disk left out":            {agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{vda}}, "/dev/sr0: no evidence"},
		"a disk it was not given":    {agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{{Disk: "/dev/vdb", Method: "overwrite", Verification: "x", Checked: "y"}, sr0}}, "/dev/vdb: not a disk the host was given"},
		"a disk twice":               {agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{vda, vda}}, "/dev/vda: reported twice"},
		"more disks than given":      {agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{vda, sr0, vda}}, "the host reported 3 disks, more than the 2 it was given"},
		"metadata is not erase":      {agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{{Disk: "/dev/vda", Method: "wipe-metadata", Verification: "metadata-regions-read-zero", Checked: "y"}, sr0}}, `/dev/vda: method "wipe-metadata" does not give level erase`},
		"not checked":                {agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{unchecked, sr0}}, "/dev/vda: erased by overwrite but not checked"},
		"checked the wrong way":      {agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{wrongCheck, sr0}}, `/dev/vda: erased by overwrite but checked by "sampled-reads-changed", not "sampled-reads-zero"`},
		"spared without a reason":    {agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{skipped, sr0}}, "/dev/vda: spared, but the host's inventory shows no boot medium there"},
		"an erase that failed":       {agentwire.StepResult{ExitCode: 1, Error: "1 disk failed", Sanitization: []agentwire.DiskSanitization{failed, sr0}}, "/dev/vda: disk /dev/vda: verify overwrite: byte 4096 reads 0x5a"},
		"a step that failed as such": {agentwire.StepResult{ExitCode: 1, Error: "out of memory", Sanitization: []agentwire.DiskSanitization{vda, sr0}}, "the sanitize step failed: out of memory"},
		"part of a disk":             {agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{short, sr0}}, "/dev/vda: erased 1000000000 bytes of 20000000000"},
	} {
		t.Run(name, func(t *testing.T) {
			a := owing(t, boot1)
			require.Len(t, next(t, a), 1)
			require.NoError(t, result(t, a, tc.r))
			got := get(t, a)
			require.True(t, lifecycle.SanitizationOwed(got), "still quarantined")
			require.Equal(t, v1beta1.SanitizationFailed, got.Status.DiskSanitization.State)
			require.Contains(t, got.Status.DiskSanitization.Message, tc.want)
			require.Contains(t, got.Status.DiskSanitization.Message, "tries again the next time it boots the discovery image")
			require.Empty(t, next(t, a), "not again in the same boot")

			// A new boot of the discovery image tries again, once it
			// reported its inventory in that boot.
			newBoot(t, a)
			require.Empty(t, next(t, a), "not with the inventory of the last boot")
			inventoried(t, a)
			require.Len(t, next(t, a), 1)
		})
	}

	t.Run("no fresh inventory, no disks, a disk listed late", func(t *testing.T) {
		a := owing(t, boot1)
		newBoot(t, a)
		require.Empty(t, next(t, a), "the inventory is from the last boot")
		cur := get(t, a)
		later := metav1.NewTime(time.Now().Add(2 * time.Second))
		cur.Status.Inventory.ReportTime, cur.Status.Inventory.Disks = &later, nil
		require.NoError(t, env.Client.Status().Update(ctx, cur))
		require.Empty(t, next(t, a), "an installed host without disks could not list them")

		b := owing(t, boot1)
		require.Len(t, next(t, b), 1)
		cur = get(t, b)
		cur.Status.Inventory.Disks = append(cur.Status.Inventory.Disks, v1beta1.HostDisk{ID: "/dev/sdb", Path: "/dev/sdb",
			InstallationEligibility: v1beta1.HostInstallationEligibility{Eligible: true, NotEligibleReasons: []string{}}})
		require.NoError(t, env.Client.Status().Update(ctx, cur))
		require.NoError(t, result(t, b, agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{vda, sr0}}))
		require.Contains(t, get(t, b).Status.DiskSanitization.Message, "/dev/sdb: the host listed this disk after it was given the step")
	})

	t.Run("disks to keep", func(t *testing.T) {
		withKeep := func(t *testing.T, keep ...string) *v1beta1.Agent {
			a := owing(t, boot1)
			cur := get(t, a)
			cur.Status.Inventory.Disks = append(cur.Status.Inventory.Disks, v1beta1.HostDisk{ID: "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", Path: "/dev/sdb",
				ByID: "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", Serial: "ZA1B2C3D", Wwn: "0x5000c500a1b2c3d4", DriveType: "HDD", SizeBytes: 4e12,
				InstallationEligibility: v1beta1.HostInstallationEligibility{Eligible: true, NotEligibleReasons: []string{}}})
			cur.Status.DiskSanitization.Keep = keep
			require.NoError(t, env.Client.Status().Update(ctx, cur))
			if len(keep) > 0 {
				// The host's BareMetalHost lists them, as the controller
				// copied them.
				bmh := &metal3.BareMetalHost{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "bmh-" + a.Name[len(a.Name)-4:],
					Annotations: map[string]string{sanitize.KeepAnnotation: strings.Join(keep, ",")}},
					Spec: metal3.BareMetalHostSpec{BMC: metal3.BMCDetails{Address: "redfish://192.0.2.1", CredentialsName: "c"}}}
				require.NoError(t, env.Client.Create(ctx, bmh))
				cur = get(t, a)
				patch := client.MergeFrom(cur.DeepCopy())
				if cur.Labels == nil {
					cur.Labels = map[string]string{}
				}
				cur.Labels[v1beta1.BMHLabel] = bmh.Name
				require.NoError(t, env.Client.Patch(ctx, cur, patch))
				require.Eventually(t, func() bool {
					var got metal3.BareMetalHost
					return env.Client.Get(ctx, client.ObjectKeyFromObject(bmh), &got) == nil
				}, 10*time.Second, 50*time.Millisecond)
			}
			return a
		}
		keptSdb := agentwire.DiskSanitization{Disk: "/dev/sdb", Method: "skip", Why: "an administrator marked it to keep"}
		for _, name := range []string{"/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", "ZA1B2C3D", "0x5000c500a1b2c3d4"} {
			a := withKeep(t, name)
			steps := next(t, a)
			require.Len(t, steps, 1)
			require.Equal(t, &agentwire.SanitizeStep{Level: "erase", Disks: []string{"/dev/vda", "/dev/sr0", "/dev/sdb"}, Keep: []string{"/dev/sdb"}}, steps[0].Sanitize, "kept as %s", name)
		}
		a := withKeep(t, "ZA1B2C3D")
		require.Len(t, next(t, a), 1)
		require.NoError(t, result(t, a, agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{vda, sr0, keptSdb}}))
		require.Equal(t, v1beta1.SanitizationDone, get(t, a).Status.DiskSanitization.State, "%s", get(t, a).Status.DiskSanitization.Message)
		require.True(t, get(t, a).Status.DiskSanitization.Disks[2].Kept, "the record says it was kept")

		// Skipping a disk nobody marked to keep is no sanitization.
		a = withKeep(t)
		require.Len(t, next(t, a), 1)
		require.NoError(t, result(t, a, agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{vda, sr0, keptSdb}}))
		require.Contains(t, get(t, a).Status.DiskSanitization.Message, "/dev/sdb: spared, but the host's inventory shows no boot medium there and it is not a disk to keep")

		// The agent erased a disk to keep (one older than the keep
		// list): the record says so and the host stays quarantined.
		a = withKeep(t, "ZA1B2C3D")
		require.Len(t, next(t, a), 1)
		erasedSdb := vda
		erasedSdb.Disk, erasedSdb.Bytes = "/dev/sdb", 4e12
		require.NoError(t, result(t, a, agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{vda, sr0, erasedSdb}}))
		require.Contains(t, get(t, a).Status.DiskSanitization.Message, "/dev/sdb: a disk to keep, but the host reports it erased by overwrite")

		// What holds the erase, saying why: an entry that names no disk (a
		// kernel name recorded as written), a serial two drives share.
		for keep, want := range map[string]string{
			"ZA1B2C3X": `the disk to keep "ZA1B2C3X" matches no disk of the host's inventory`,
			"/dev/sdb": `the disk to keep "/dev/sdb" matches no disk of the host's inventory`,
			"SHARED":   `the disk to keep "SHARED" matches 2 disks that are not one`,
		} {
			a = withKeep(t, keep)
			cur := get(t, a)
			cur.Status.Inventory.Disks[0].Serial, cur.Status.Inventory.Disks[2].Serial = "SHARED", "SHARED"
			require.NoError(t, env.Client.Status().Update(ctx, cur))
			require.Empty(t, next(t, a), keep)
			ds := get(t, a).Status.DiskSanitization
			require.Equal(t, v1beta1.SanitizationPending, ds.State)
			require.Contains(t, ds.Message, want)
			require.True(t, lifecycle.SanitizationOwed(get(t, a)))
			_, err := ChooseDisk(get(t, a))
			require.ErrorContains(t, err, want, "nor is anything installed meanwhile")
		}

		// A multipath LUN: keeping one path keeps every path to it.
		a = withKeep(t, "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4")
		cur := get(t, a)
		cur.Status.Inventory.Disks = append(cur.Status.Inventory.Disks, v1beta1.HostDisk{ID: "/dev/sdc", Path: "/dev/sdc", Wwn: "0x5000c500a1b2c3d4", Serial: "ZA1B2C3D", SizeBytes: 4e12,
			InstallationEligibility: v1beta1.HostInstallationEligibility{Eligible: true, NotEligibleReasons: []string{}}})
		require.NoError(t, env.Client.Status().Update(ctx, cur))
		steps := next(t, a)
		require.Len(t, steps, 1)
		require.Equal(t, []string{"/dev/sdb", "/dev/sdc"}, steps[0].Sanitize.Keep)

		// The list changes while an attempt shows running, and the host
		// asks again in the same boot: held, and Pending again, so that
		// the controller (which defers while one runs) can record it.
		a = withKeep(t, "ZA1B2C3D")
		require.Len(t, next(t, a), 1)
		require.Equal(t, v1beta1.SanitizationRunning, get(t, a).Status.DiskSanitization.State)
		var listed metal3.BareMetalHost
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: "agents", Name: get(t, a).Labels[v1beta1.BMHLabel]}, &listed))
		listed.Annotations[sanitize.KeepAnnotation] = "ZA1B2C3D,/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"
		require.NoError(t, env.Client.Update(ctx, &listed))
		require.Eventually(t, func() bool {
			return len(next(t, a)) == 0 && get(t, a).Status.DiskSanitization.State == v1beta1.SanitizationPending
		}, 10*time.Second, 100*time.Millisecond)
		require.Contains(t, get(t, a).Status.DiskSanitization.Message, "are not recorded on the Agent yet")

		// The inventory reports one by-id link per disk; the WWN's link
		// names the disk too.
		ata := v1beta1.HostDisk{Path: "/dev/sdb", ByID: "/dev/disk/by-id/ata-ST4000_ZA1B2C3D", Wwn: "0x5000C500A1B2C3D4"}
		nvme := v1beta1.HostDisk{Path: "/dev/nvme0n1", ByID: "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_deadbeef", Wwn: "eui.0025388b71b0f1e2"}
		for d, k := range map[*v1beta1.HostDisk]string{&ata: "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", &nvme: "/dev/disk/by-id/nvme-eui.0025388b71b0f1e2"} {
			require.True(t, names(*d, k), "%s names %s", k, d.Path)
		}
		require.False(t, names(v1beta1.HostDisk{Path: "/dev/sdb", ID: "/dev/sdb"}, "/dev/sdb"), "never a kernel name")

		// An installation never writes a disk to keep.
		a = withKeep(t, "ZA1B2C3D")
		inst := get(t, a)
		inst.Spec.InstallationDiskID = "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"
		_, err := ChooseDisk(inst)
		require.ErrorContains(t, err, "is a disk an administrator marked to keep")
		inst.Spec.InstallationDiskID = ""
		inst.Status.Inventory.Disks[0].InstallationEligibility.Eligible = false
		_, err = ChooseDisk(inst)
		require.ErrorContains(t, err, "no eligible installation disk", "the kept disk is not chosen")

		// The disks to keep on the host's BareMetalHost, not yet copied to
		// the Agent by its controller, hold the erase.
		a = withKeep(t)
		cur = get(t, a)
		cur.Status.Inventory.Interfaces = []v1beta1.HostInterface{{MacAddress: "52:54:00:aa:bb:01", Flags: []string{}, IPV4Addresses: []string{}, IPV6Addresses: []string{}}}
		require.NoError(t, env.Client.Status().Update(ctx, cur))
		bmh := &metal3.BareMetalHost{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "server-1",
			Annotations: map[string]string{sanitize.KeepAnnotation: "ZA1B2C3D"}},
			Spec: metal3.BareMetalHostSpec{BootMACAddress: "52:54:00:AA:BB:01", BMC: metal3.BMCDetails{Address: "redfish://192.0.2.1", CredentialsName: "c"}}}
		require.NoError(t, env.Client.Create(ctx, bmh))
		require.Eventually(t, func() bool { return len(next(t, a)) == 0 }, 10*time.Second, 100*time.Millisecond)
		require.Contains(t, get(t, a).Status.DiskSanitization.Message, "the disks to keep of BareMetalHost server-1 are not recorded on the Agent yet")
		cur = get(t, a)
		cur.Status.DiskSanitization.Keep = []string{"ZA1B2C3D"}
		require.NoError(t, env.Client.Status().Update(ctx, cur))
		require.Eventually(t, func() bool { return len(next(t, a)) == 1 }, 10*time.Second, 100*time.Millisecond, "handed once the copy matches")
		require.NoError(t, env.Client.Delete(ctx, bmh))

		// A list no BareMetalHost of the host keeps any more holds the
		// erase until it is cleared.
		require.Eventually(t, func() bool { return len(next(t, a)) == 0 }, 10*time.Second, 100*time.Millisecond)
		require.Contains(t, get(t, a).Status.DiskSanitization.Message, "no BareMetalHost of this host lists them any more")
	})

	t.Run("a report from an earlier boot", func(t *testing.T) {
		a := owing(t, boot1)
		require.Len(t, next(t, a), 1)
		newBoot(t, a)
		require.ErrorContains(t, result(t, a, agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{vda, sr0}}), "no sanitize step is running for this host")
		require.True(t, lifecycle.SanitizationOwed(get(t, a)), "a host that lost power mid-erase stays quarantined")
	})
}
