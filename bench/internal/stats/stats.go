// Package stats summarizes benchmark samples the way ministat does: median,
// quartiles, min/max, and whether two sets of samples differ at 95 %
// confidence (Welch's t-test, which does not assume equal variances).
package stats

import (
	"math"
	"slices"
)

// Summary of one set of samples.
type Summary struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	P25    float64 `json:"p25"`
	P75    float64 `json:"p75"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Mean   float64 `json:"mean"`
	Stddev float64 `json:"stddev"`
}

// Summarize returns the summary of samples (zero if there are none).
func Summarize(samples []float64) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	mean, sd := meanSD(s)
	return Summary{
		N: len(s), Median: quantile(s, 0.5), P25: quantile(s, 0.25), P75: quantile(s, 0.75),
		Min: s[0], Max: s[len(s)-1], Mean: mean, Stddev: sd,
	}
}

// quantile interpolates linearly between the closest ranks of sorted s.
func quantile(s []float64, p float64) float64 {
	pos := p * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

func meanSD(s []float64) (float64, float64) {
	var sum float64
	for _, v := range s {
		sum += v
	}
	mean := sum / float64(len(s))
	if len(s) < 2 {
		return mean, 0
	}
	var ss float64
	for _, v := range s {
		ss += (v - mean) * (v - mean)
	}
	return mean, math.Sqrt(ss / float64(len(s)-1))
}

// Diff is the difference of the means of a and b with its 95 % confidence
// half-width, both in percent of b's mean (ministat prints the same).
type Diff struct {
	Percent     float64 `json:"percent"`
	PlusMinus   float64 `json:"plus_minus_percent"`
	Significant bool    `json:"significant_95"`
}

// Compare runs Welch's t-test on a against b. It returns ok=false when either
// side has fewer than two samples, so no confidence can be given.
func Compare(a, b []float64) (d Diff, ok bool) {
	if len(a) < 2 || len(b) < 2 {
		return Diff{}, false
	}
	ma, sa := meanSD(a)
	mb, sb := meanSD(b)
	va, vb := sa*sa/float64(len(a)), sb*sb/float64(len(b))
	se := math.Sqrt(va + vb)
	// Welch-Satterthwaite degrees of freedom.
	df := float64(len(a) + len(b) - 2)
	if va+vb > 0 {
		df = (va + vb) * (va + vb) / (va*va/float64(len(a)-1) + vb*vb/float64(len(b)-1))
	}
	half := t975(df) * se
	diff := ma - mb
	if mb == 0 {
		return Diff{}, false
	}
	return Diff{
		Percent:     100 * diff / mb,
		PlusMinus:   100 * half / mb,
		Significant: math.Abs(diff) > half,
	}, true
}

// t975 is the 97.5 % quantile of Student's t distribution (two-sided 95 %)
// for df degrees of freedom, rounded down to a whole df (conservative).
func t975(df float64) float64 {
	table := []float64{0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	n := int(math.Floor(df))
	switch {
	case n < 1:
		return table[1]
	case n < len(table):
		return table[n]
	case n < 40:
		return table[30]
	case n < 60:
		return 2.021
	case n < 120:
		return 2.000
	}
	return 1.980
}
