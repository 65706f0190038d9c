package main

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model/modeltest"
)

// Whatever the daemon accepts, `xlb save` then `xlb restore` (into
// another daemon) gives back byte for byte: before, a log-prefix of
// invalid UTF-8 was accepted and saved as U+FFFD characters the restore
// then refused.
func TestSaveRestoreRoundTripsAcceptedFarms(t *testing.T) {
	d := newDaemon(t)
	r := rand.New(rand.NewPCG(15, 2))
	accepted := 0
	for i := range 3000 {
		body := modeltest.FarmJSON(r, fmt.Sprintf("f%03d", i%600))
		req, _ := http.NewRequest("POST", d.url+"/farms", strings.NewReader(`{"farms":[`+body+`]}`))
		req.Header.Set("Key", testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			accepted++
		} else if resp.StatusCode >= 500 {
			t.Fatalf("%s: status %d", body, resp.StatusCode)
		}
	}
	if accepted < 200 {
		t.Fatalf("only %d farms accepted", accepted)
	}
	file := filepath.Join(t.TempDir(), "state.json")
	d.xlb(t, "save", "-f", file)
	dump := d.xlb(t, "dump")
	other := newDaemon(t)
	other.xlb(t, "restore", "-f", file)
	if got := other.xlb(t, "dump"); got != dump {
		t.Fatalf("save -> restore -> dump differs")
	}
	t.Logf("%d changes accepted; %d bytes of state round-tripped", accepted, len(dump))
}
