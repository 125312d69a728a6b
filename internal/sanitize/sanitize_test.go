package sanitize

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Policy × device capabilities → method: the fastest method that gives the
// level's guarantee on each kind of device, and never touching what must
// not be touched.
func TestChoose(t *testing.T) {
	nvme := Device{WriteZeroes: true, NVMeSanitizeCrypto: true, NVMeSanitizeBlock: true, NVMeFormatCrypto: true, NVMeFormatUserData: true}
	cases := map[string]struct {
		level  Level
		dev    Device
		method Method
		verify Verification
		why    string
	}{
		"level none":                      {None, nvme, Skip, NotVerified, "level is none"},
		"boot medium, even at erase":      {Erase, Device{BootMedium: true, WriteZeroes: true}, Skip, NotVerified, "booted from this device"},
		"boot medium, even at metadata":   {Metadata, Device{BootMedium: true}, Skip, NotVerified, "booted from this device"},
		"no medium":                       {Erase, Device{Empty: true}, Skip, NotVerified, "no medium"},
		"kept by the admin":               {Erase, Device{Kept: true}, Skip, NotVerified, "marked this disk to keep"},
		"read-only":                       {Erase, Device{ReadOnly: true}, Unerasable, NotVerified, "read-only"},
		"no capacity, not removable":      {Erase, Device{NoCapacity: true, NVMeFormatUserData: true}, Unerasable, NotVerified, "whose format was cut off"},
		"no capacity, even at metadata":   {Metadata, Device{NoCapacity: true}, Unerasable, NotVerified, "format it (with a secure erase), remove it, or mark it to keep"},
		"metadata on anything":            {Metadata, nvme, WipeMetadata, MetadataReadsZero, "level is metadata"},
		"NVMe with crypto sanitize":       {Erase, nvme, NVMeSanitizeCrypto, ReadsChanged, "cryptographic sanitize"},
		"NVMe with crypto format only":    {Erase, Device{NVMeFormatCrypto: true, NVMeFormatUserData: true, WriteZeroes: true}, NVMeFormatCrypto, ReadsChanged, "cryptographic erase on format"},
		"NVMe with block sanitize":        {Erase, Device{NVMeSanitizeBlock: true, WriteZeroes: true}, NVMeSanitizeBlock, ReadsChanged, "block-erase sanitize"},
		"SSD with Write Zeroes":           {Erase, Device{WriteZeroes: true, ATASecurityErase: true}, WriteZeroes, ReadsZero, "zeroes blocks itself"},
		"SSD without Write Zeroes":        {Erase, Device{ATASecurityErase: true, ATAEnhancedErase: true}, ATAEnhancedErase, ReadsChanged, "enhanced security erase"},
		"HDD with ATA security erase":     {Erase, Device{ATASecurityErase: true}, ATASecurityErase, ReadsChanged, "ATA security erase"},
		"ATA erase frozen by firmware":    {Erase, Device{ATASecurityErase: true, ATAEnhancedErase: true, ATAFrozen: true}, Overwrite, ReadsZero, "frozen"},
		"NVMe with user-data format only": {Erase, Device{NVMeFormatUserData: true}, NVMeFormatUserData, ReadsChanged, "user-data erase on format"},
		"plain disk (virtio, SAS HDD)":    {Erase, Device{}, Overwrite, ReadsZero, "written with zeros"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := Choose(tc.level, tc.dev)
			require.Equal(t, tc.method, p.Method)
			require.Equal(t, tc.verify, p.Verify)
			require.Contains(t, p.Why, tc.why)
			require.Equal(t, VerificationOf(p.Method), p.Verify, "one verification per method")
			if p.Method.ErasesEveryBlock() {
				require.True(t, Offers(tc.dev, p.Method), "the device offers what it gets")
			}
		})
	}
}

// An admin (or the lab) may ask for a slower method a device offers; never
// for one it does not, and never so as to erase a disk Choose spares.
func TestForce(t *testing.T) {
	nvme := Device{WriteZeroes: true, NVMeFormatUserData: true}
	cases := map[string]struct {
		level  Level
		dev    Device
		asked  Method
		method Method
		why    string
	}{
		"a format the device offers":   {Erase, nvme, NVMeFormatUserData, NVMeFormatUserData, "nvme-format-user-data was asked for (the device would get write-zeroes)"},
		"an overwrite, always offered": {Erase, nvme, Overwrite, Overwrite, "overwrite was asked for"},
		"a command the device lacks":   {Erase, nvme, NVMeSanitizeCrypto, Unerasable, "the device does not offer nvme-sanitize-crypto (it would get write-zeroes)"},
		"a frozen ATA erase":           {Erase, Device{ATASecurityErase: true, ATAFrozen: true}, ATASecurityErase, Unerasable, "does not offer ata-security-erase"},
		"not an erase method":          {Erase, nvme, WipeMetadata, Unerasable, `"wipe-metadata" is not a method of the erase level`},
		"an unknown method":            {Erase, nvme, "shred", Unerasable, `"shred" is not a method`},
		"the boot medium stays spared": {Erase, Device{BootMedium: true, NVMeFormatUserData: true}, NVMeFormatUserData, Skip, "booted from this device"},
		"a kept disk stays spared":     {Erase, Device{Kept: true, NVMeFormatUserData: true}, NVMeFormatUserData, Skip, "marked this disk to keep"},
		"metadata level stays":         {Metadata, nvme, NVMeFormatUserData, WipeMetadata, "level is metadata"},
		"level none stays":             {None, nvme, NVMeFormatUserData, Skip, "level is none"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := Force(tc.level, tc.dev, tc.asked)
			require.Equal(t, tc.method, p.Method)
			require.Equal(t, VerificationOf(p.Method), p.Verify)
			require.Contains(t, p.Why, tc.why)
		})
	}
}

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]Level{"": Erase, "erase": Erase, "metadata": Metadata, "none": None} {
		got, err := ParseLevel(in)
		require.NoError(t, err)
		require.Equal(t, want, got, in)
	}
	_, err := ParseLevel("full")
	require.ErrorContains(t, err, `disk sanitization level "full": want none, metadata or erase`)
}

func TestGives(t *testing.T) {
	require.True(t, Gives(Overwrite, Erase))
	require.True(t, Gives(WriteZeroes, Metadata), "more than metadata is enough for metadata")
	require.True(t, Gives(WipeMetadata, Metadata))
	require.False(t, Gives(WipeMetadata, Erase))
	require.False(t, Gives(Skip, Metadata))
	require.False(t, Gives(Unerasable, Erase))
	require.False(t, Gives("shred", Erase))
}
