package stats

import (
	"math"
	"testing"
)

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{5, 1, 4, 2, 3})
	want := Summary{N: 5, Median: 3, P25: 2, P75: 4, Min: 1, Max: 5, Mean: 3, Stddev: math.Sqrt(2.5)}
	if s != want {
		t.Fatalf("Summarize = %+v, want %+v", s, want)
	}
	if s := Summarize([]float64{1, 2}); s.Median != 1.5 {
		t.Fatalf("median of 1, 2 = %v, want 1.5 (interpolated)", s.Median)
	}
	if s := Summarize(nil); s.N != 0 {
		t.Fatalf("Summarize(nil) = %+v, want zero", s)
	}
}

func TestCompare(t *testing.T) {
	// ministat's own example style: clearly different means, small spread.
	a := []float64{110, 111, 109, 110, 110}
	b := []float64{100, 101, 99, 100, 100}
	d, ok := Compare(a, b)
	if !ok || !d.Significant || math.Abs(d.Percent-10) > 1e-9 {
		t.Fatalf("Compare = %+v, %v; want +10 %%, significant", d, ok)
	}
	// Overlapping samples: no difference at 95 %.
	d, ok = Compare([]float64{90, 110, 100}, []float64{95, 105, 101})
	if !ok || d.Significant {
		t.Fatalf("Compare of overlapping samples = %+v, want not significant", d)
	}
	if _, ok := Compare([]float64{1}, []float64{1, 2}); ok {
		t.Fatal("Compare with one sample gave a confidence")
	}
}
