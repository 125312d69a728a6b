// Command redfish-sim runs agentboot's Redfish BMC simulator with an
// in-memory server behind it, for trying BareMetalHosts without hardware:
// it logs every power, boot and virtual media action it is asked for.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/agentboot/agentboot/test/bmcsim"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8000", "address to serve Redfish on (plain HTTP)")
	user := flag.String("username", "admin", "BMC username")
	pass := flag.String("password", "password", "BMC password")
	realistic := flag.Bool("realistic", false, "behave like a real server's BMC: answers in 0.1–0.6 s, power transitions of 1–11 s, "+
		"an OS taking 2–10 s to shut down, 409 during transitions")
	flag.Parse()
	sim := &bmcsim.Redfish{User: *user, Password: *pass, Machine: &bmcsim.MemMachine{}}
	if *realistic {
		sim.SetTiming(bmcsim.Realistic)
	}
	// Polled rather than hooked: with -realistic, a power-on completes
	// seconds after the request that asked for it.
	go func() {
		seen := 0
		for range time.Tick(200 * time.Millisecond) {
			evs := sim.Events()
			for _, ev := range evs[seen:] {
				fmt.Printf("%s redfish-sim: %s\n", time.Now().Format(time.TimeOnly), ev)
			}
			seen = len(evs)
		}
	}()
	fmt.Printf("redfish-sim: serving redfish-virtualmedia+http://%s/redfish/v1/Systems/1\n", *listen)
	srv := &http.Server{Addr: *listen, Handler: sim, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}
