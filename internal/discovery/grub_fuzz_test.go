package discovery

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/cmdwords"
)

// grubLine is one linux line of a GRUB boot script: the kernel word, then
// each argument single-quoted (GRUB expands nothing inside and a quote
// cannot appear there).
var grubLine = regexp.MustCompile(`^linux "\$agentboot_root/[^"$\\'` + "`" + `\s]+"((?: '[^'\n]*')*)$`)

// FuzzGRUBScript: whatever kernel argument an InfraEnv holds, a value the
// renderer accepts gives a GRUB script with exactly the commands meant
// (echo, linux, echo, initrd, boot), each argument a single-quoted word
// that reaches the kernel as the InfraEnv wrote it; or a refusal.
func FuzzGRUBScript(f *testing.F) {
	for _, seed := range []string{`console=ttyS0,115200n8`, `x="a ; boot"`, `a=$x`, `a='b'`, `a\b`, "a\nlinux x", `x="a b"`, `"`} {
		f.Add(seed)
	}
	s := Settings{ImageServiceHTTPURL: "http://198.18.0.1:8080"}
	f.Fuzz(func(t *testing.T, value string) {
		args, err := kernelArguments("coreos.liveiso=x ignition.firstboot", []v1beta1.KernelArgument{{Value: value}})
		if err != nil {
			return // refused: nothing is rendered
		}
		out := &Output{PXEKargs: strings.Join(append(append([]string{"initrd=initrd"}, args...), "BOOTIF=01-${netX/mac:hexhyp}"), " ")}
		out.URLs.Initrd, out.URLs.Kernel = "http://198.18.0.1:8080/images/u/v/initrd.img?token=a.b&x=1", "http://198.18.0.1:8080/boot-artifacts/aarch64/v/vmlinuz"
		script, err := out.GRUBScript(s, "52:54:00:aa:00:01")
		if err != nil {
			if !strings.ContainsAny(value, `"'\`) {
				t.Fatalf("kernel argument %q refused: %v", value, err)
			}
			return
		}
		lines := strings.Split(strings.TrimSuffix(script, "\n"), "\n")
		var commands []string
		for _, l := range lines {
			commands = append(commands, strings.Fields(l)[0])
		}
		if strings.Join(commands, ",") != "echo,linux,echo,initrd,boot" {
			t.Fatalf("kernel argument %q gives commands %q:\n%s", value, commands, script)
		}
		m := grubLine.FindStringSubmatch(lines[1])
		if m == nil {
			t.Fatalf("kernel argument %q: linux line %q is not the kernel and single-quoted arguments", value, lines[1])
		}
		var got []string
		for _, w := range strings.Split(strings.TrimPrefix(m[1], " "), " '") {
			got = append(got, strings.Trim(w, "'"))
		}
		want := append(slices.Clone(cmdwords.Split(strings.Join(args, " "))), "BOOTIF=01-52-54-00-aa-00-01")
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("kernel argument %q reaches the kernel as %q, want %q", value, got, want)
		}
	})
}
