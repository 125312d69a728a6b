// Command chassis is ipmi_sim's chassis_control program for agentboot's
// tests: ipmi_sim runs it as `chassis -socket <path> 0x20 get power` (or
// `set power 1`, `set boot pxe`, ...), and it forwards the request to the
// test that owns the simulated machine (bmcsim.IPMI) over a Unix socket.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

func main() {
	socket := flag.String("socket", "", "the test's Unix socket")
	flag.Parse()
	if *socket == "" || flag.NArg() < 3 {
		fmt.Fprintln(os.Stderr, "usage: chassis -socket <path> <mc> get|set <item> [value]")
		os.Exit(2)
	}
	c, err := net.DialTimeout("unix", *socket, 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chassis:", err)
		os.Exit(1)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintln(c, strings.Join(flag.Args()[1:], " "))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, "chassis:", err)
		os.Exit(1)
	}
	line = strings.TrimSpace(line)
	if msg, bad := strings.CutPrefix(line, "error: "); bad {
		fmt.Fprintln(os.Stderr, "chassis:", msg)
		os.Exit(1)
	}
	if line != "" {
		fmt.Println(line)
	}
}
