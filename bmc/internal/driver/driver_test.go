package driver

import "testing"

func TestParsePowerState(t *testing.T) {
	for raw, want := range map[string]Power{
		"Chassis Power is on\n":  On,
		"Chassis Power is off\n": Off,
		"On":                     On,
		"Off":                    Off,
		"PoweringOn":             PoweringOn,
		"PoweringOff":            PoweringOff,
	} {
		got, err := ParsePowerState(raw)
		if err != nil || got != want {
			t.Errorf("ParsePowerState(%q) = %v, %v; want %v", raw, got, err, want)
		}
	}
	for _, raw := range []string{"", "  ", "Paused", "unknown"} {
		if _, err := ParsePowerState(raw); err == nil {
			t.Errorf("ParsePowerState(%q) accepted", raw)
		}
	}
}

func TestScrub(t *testing.T) {
	got := Scrub("failed: 1 error occurred:\n\t* provider: gofish: 401 for user admin password hunter2\n\n", "hunter2")
	if want := "failed: 1 error occurred:; provider: gofish: 401 for user admin password ***"; got != want {
		t.Fatalf("Scrub = %q, want %q", got, want)
	}
}
