package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"time"
)

// nftlb itself (Debian's nftlb package, the daemon xlb's API follows) as a
// baseline: the same API calls against it, in the same network namespace,
// while xlb holds no farms. Its binary comes from the package without
// installing it (bench/run.sh extracts it), because installing the package
// on a systemd host starts an nftlb service that programs the host's
// nftables.
var (
	nftlbBin   = flag.String("nftlb", "nftlb", "nftlb binary for the nftlb baseline (\"\": skip it, and say so in the results)")
	nftlbSizes = flag.String("nftlb-existing", "0,1000", "farm counts present in nftlb while adding one farm")
	nftlbRuns  = flag.Int("nftlb-runs", 15, "samples per nftlb measurement")
	onlyNftlb  = flag.Bool("only-nftlb", false, "measure only the nftlb baseline; results in nftlb-baseline.{md,json}")
	nftlbBulk  = flag.Bool("nftlb-bulk", true, "also time nftlb's bulk POST of 1000 farms x 4 backends (minutes)")
)

const nftlbAddr = "127.0.0.1:5591"

// nftlbDaemon is one nftlb process with an empty ruleset.
type nftlbDaemon struct{ cmd *exec.Cmd }

func startNftlb() *nftlbDaemon {
	dropNftlbTables()
	cmd := exec.Command(*nftlbBin, "-k", key, "-H", "127.0.0.1", "-P", "5591", "-l", "3")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatalf("nftlb baseline: start %s: %v (bench/run.sh extracts Debian's nftlb; -nftlb \"\" skips it)", *nftlbBin, err)
	}
	d := &nftlbDaemon{cmd: cmd}
	for range 100 {
		if _, err := nftlbCall("GET", "/farms", nil); err == nil {
			return d
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.stop()
	log.Fatal("nftlb baseline: nftlb did not answer on " + nftlbAddr)
	return nil
}

func (d *nftlbDaemon) stop() {
	d.cmd.Process.Kill()
	d.cmd.Wait()
	dropNftlbTables()
}

// dropNftlbTables removes what nftlb left in this (the benchmark's own)
// network namespace.
func dropNftlbTables() {
	for _, fam := range []string{"ip", "ip6", "netdev"} {
		exec.Command("nft", "delete", "table", fam, "nftlb").Run()
	}
}

// nftlbClient opens a connection per request: nftlb closes idle
// connections without notice, and a reused one then fails with a reset.
var nftlbClient = &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}

func nftlbCall(method, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequest(method, "http://"+nftlbAddr+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Key", key)
	resp, err := nftlbClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	if resp.StatusCode >= 300 || bytes.Contains(buf.Bytes(), []byte(`"error"`)) {
		return nil, fmt.Errorf("nftlb %s %s: %s: %s", method, path, resp.Status, buf.Bytes())
	}
	return buf.Bytes(), nil
}

func mustNftlb(method, path string, body []byte) {
	if _, err := nftlbCall(method, path, body); err != nil {
		log.Fatalf("nftlb baseline: %v", err)
	}
}

// nftlbResults: one API call adding a farm of 100 backends with n farms
// present, and one bulk POST of 1000 farms x 4 backends (one sample: nftlb
// takes minutes), each against nftlb.
func nftlbResults() []result {
	if *nftlbBin == "" {
		log.Print("nftlb baseline skipped (-nftlb \"\")")
		return nil
	}
	var out []result
	for _, n := range parseInts(*nftlbSizes) {
		d := startNftlb()
		t0 := time.Now()
		if n > 0 {
			mustNftlb("POST", "/farms", farmsJSON("g", n, 1, 64))
		}
		log.Printf("nftlb: %d farms x 1 loaded in %s", n, time.Since(t0).Round(time.Millisecond))
		var xs []float64
		for i := range *nftlbRuns {
			name := fmt.Sprintf("new%03d", i)
			body := farmsJSON(name, 1, 100, 200)
			t := time.Now()
			mustNftlb("POST", "/farms", body)
			xs = append(xs, ms(time.Since(t)))
			mustNftlb("DELETE", "/farms/"+name+"00000", nil)
		}
		d.stop()
		r := summarize(fmt.Sprintf("nftlb API add farm x 100 backends, %d farms present", n), xs)
		log.Printf("nftlb add farm x100 at %d farms: median %.2f ms", n, r.Median)
		// xlb, the same calls with the same farms present, right after.
		restore(n, 1)
		var ys []float64
		for i := range *nftlbRuns {
			name := fmt.Sprintf("new%03d", i)
			body := farmsJSON(name, 1, 100, 200)
			t := time.Now()
			call("POST", "/farms", body)
			ys = append(ys, ms(time.Since(t)))
			call("DELETE", "/farms/"+name+"00000", nil)
		}
		restore(0, 1)
		out = append(out, withBaseline(summarize(fmt.Sprintf("API add farm x 100 backends, %d farms present (against nftlb)", n), ys), r), r)
	}
	if !*nftlbBulk {
		return out
	}
	d := startNftlb()
	t := time.Now()
	mustNftlb("POST", "/farms", farmsJSON("bulk", 1000, 4, 300))
	bulk := summarize("nftlb API bulk POST 1000 farms x 4 backends (one sample)", []float64{ms(time.Since(t))})
	d.stop()
	log.Printf("nftlb bulk 1000x4: %.0f ms", bulk.Median)
	var ys []float64
	for range 3 {
		restore(0, 1)
		t := time.Now()
		call("POST", "/farms", farmsJSON("bulk", 1000, 4, 300))
		ys = append(ys, ms(time.Since(t)))
	}
	restore(0, 1)
	return append(out, withBaseline(summarize("API bulk POST 1000 farms x 4 backends (against nftlb)", ys), bulk), bulk)
}
