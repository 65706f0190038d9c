// Command xlb-echo is the backend server of the demo and the benchmarks: it
// answers HTTP requests with its name and the client address it saw, so the
// demo can count which backend served each request and whether the client's
// address was preserved.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

func main() {
	name := flag.String("name", "backend", "name put in every answer")
	listen := flag.String("listen", ":80", "HTTP listen address")
	udp := flag.String("udp", "", "also answer UDP datagrams on this address")
	flag.Parse()
	if *udp != "" {
		pc, err := net.ListenPacket("udp", *udp)
		if err != nil {
			log.Fatalf("listen udp %s: %v", *udp, err)
		}
		go func() {
			buf := make([]byte, 2048)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(fmt.Appendf(nil, "%s %s\n", *name, from), from)
			}
		}()
	}
	// SIGUSR1 toggles failing: every answer is then HTTP 503 while TCP
	// still connects (the health checks' benchmark fault).
	var failing atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	go func() {
		for range sig {
			failing.Store(!failing.Load())
		}
	}()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintf(w, "%s %s\n", *name, r.RemoteAddr)
	})
	log.Fatal(http.ListenAndServe(*listen, h))
}
