// Command accel prints which qemu accelerator the VM tests use and why,
// probing first when this machine has no answer yet (test/vm.Choose): `make
// test` runs it before the tests, so the choice is visible and every test
// process reads the same answer.
package main

import (
	"fmt"

	"github.com/agentboot/agentboot/test/vm"
)

func main() { fmt.Println(vm.Choose()) }
