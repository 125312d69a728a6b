package discovery

import (
	"strings"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/cmdwords"
)

func kargKey(a string) string {
	k, _, _ := strings.Cut(a, "=")
	return k
}

// validKarg rejects what could break out of an iPXE script line or a boot
// loader config: the CRD already refuses it, this guards anything else that
// reaches the renderer. iPXE has no quoting: it expands ${...} settings
// (which a DHCP server can set) in the whole line, splits it at spaces and
// ends a command at a word ";", "&&" or "||", or a word starting with '#'.
func validKarg(a string) bool {
	if a == "" || strings.Count(a, `"`)%2 != 0 || strings.Contains(a, "${") {
		return false
	}
	for _, word := range strings.Fields(a) {
		if word == ";" || word == "&&" || word == "||" {
			return false
		}
	}
	quoted := false
	for _, r := range a {
		switch {
		case r == '"':
			quoted = !quoted
		case r < 0x20 || r == 0x7f || r == '#':
			return false
		case r == ' ' && !quoted:
			return false
		}
	}
	return true
}

// kernelArguments applies the InfraEnv's operations to the image's default
// arguments: append adds, replace sets every argument with the value's key
// (appending when there is none), delete removes exact matches or, for a bare
// key, every argument with that key.
func kernelArguments(defaults string, ops []v1beta1.KernelArgument) ([]string, error) {
	args := cmdwords.Split(defaults)
	for i, op := range ops {
		if !validKarg(op.Value) {
			return nil, inputErrorf("spec.kernelArguments[%d].value %q is not a single kernel argument", i, op.Value)
		}
		switch op.Operation {
		case "", "append":
			args = append(args, op.Value)
		case "replace":
			key, replaced := kargKey(op.Value), false
			for j := range args {
				if kargKey(args[j]) == key {
					args[j], replaced = op.Value, true
				}
			}
			if !replaced {
				args = append(args, op.Value)
			}
		case "delete":
			exact := strings.Contains(op.Value, "=")
			kept := args[:0]
			for _, a := range args {
				if a == op.Value || (!exact && kargKey(a) == op.Value) {
					continue
				}
				kept = append(kept, a)
			}
			args = kept
		default:
			return nil, inputErrorf("spec.kernelArguments[%d].operation %q: want append, replace or delete", i, op.Operation)
		}
	}
	return args, nil
}

// without returns args minus every argument with key.
func without(args []string, key string) []string {
	var out []string
	for _, a := range args {
		if kargKey(a) != key {
			out = append(out, a)
		}
	}
	return out
}

func contains(args []string, a string) bool {
	for _, x := range args {
		if x == a {
			return true
		}
	}
	return false
}
