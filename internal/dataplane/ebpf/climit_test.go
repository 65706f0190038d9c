package ebpf

import (
	"math"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
)

// TestClientRate: new-rtlimit in every unit becomes the interval and
// tolerance of nft's bucket (burst 0 is the kernel's default of 5).
func TestClientRate(t *testing.T) {
	for _, c := range []struct {
		rate  uint32
		unit  model.RateUnit
		burst uint32
		iv    time.Duration
		tol   uint64
	}{
		{0, model.PerSecond, 9, 0, 0},
		{5, model.PerSecond, 5, 200 * time.Millisecond, uint64(800 * time.Millisecond)},
		{300, model.PerMinute, 5, 200 * time.Millisecond, uint64(800 * time.Millisecond)},
		{10, model.PerSecond, 0, 100 * time.Millisecond, uint64(400 * time.Millisecond)},
		{10, model.PerSecond, 1, 100 * time.Millisecond, 0},
		{2, model.PerHour, 3, 30 * time.Minute, uint64(time.Hour)},
		{24, model.PerDay, 1, time.Hour, 0},
		{7, model.PerWeek, 2, 24 * time.Hour, uint64(24 * time.Hour)},
		{1, model.PerWeek, math.MaxInt32, 7 * 24 * time.Hour, math.MaxUint64},
	} {
		iv, tol := clientRate(c.rate, c.unit, c.burst)
		if iv != uint64(c.iv) || tol != c.tol {
			t.Errorf("clientRate(%d/%s burst %d) = %d, %d; want %d, %d", c.rate, c.unit, c.burst, iv, tol, c.iv, c.tol)
		}
	}
}
