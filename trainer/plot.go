package trainer

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
)

// writeLossPNG draws the training loss (blue, every step) and the validation loss
// (red dots) against the step, on axes from 0 to the last step and from the lowest
// to the highest loss, with a light grid every tenth.
func writeLossPNG(path string, curve []Metrics) error {
	const W, H, pad = 800, 480, 40
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, m := range curve {
		for _, v := range []float64{m.Loss, valOr(m, m.Loss)} {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if len(curve) == 0 || math.IsInf(lo, 0) {
		return savePNG(path, img)
	}
	if hi-lo < 1e-9 {
		hi = lo + 1
	}
	steps := float64(curve[len(curve)-1].Step)
	x := func(step int) int { return pad + int(float64(step)/math.Max(steps, 1)*float64(W-2*pad)) }
	y := func(v float64) int { return H - pad - int((v-lo)/(hi-lo)*float64(H-2*pad)) }
	grid := color.RGBA{225, 225, 225, 255}
	for i := 0; i <= 10; i++ {
		line(img, pad+i*(W-2*pad)/10, pad, pad+i*(W-2*pad)/10, H-pad, grid)
		line(img, pad, pad+i*(H-2*pad)/10, W-pad, pad+i*(H-2*pad)/10, grid)
	}
	black := color.RGBA{0, 0, 0, 255}
	line(img, pad, H-pad, W-pad, H-pad, black)
	line(img, pad, pad, pad, H-pad, black)
	blue, red := color.RGBA{31, 119, 180, 255}, color.RGBA{214, 39, 40, 255}
	for i := 1; i < len(curve); i++ {
		a, b := curve[i-1], curve[i]
		if math.IsNaN(a.Loss) || math.IsNaN(b.Loss) {
			continue
		}
		line(img, x(a.Step), y(a.Loss), x(b.Step), y(b.Loss), blue)
	}
	for _, m := range curve {
		if m.ValLoss != nil {
			cx, cy := x(m.Step), y(*m.ValLoss)
			for dx := -3; dx <= 3; dx++ {
				for dy := -3; dy <= 3; dy++ {
					if dx*dx+dy*dy <= 9 {
						img.Set(cx+dx, cy+dy, red)
					}
				}
			}
		}
	}
	return savePNG(path, img)
}

func valOr(m Metrics, d float64) float64 {
	if m.ValLoss != nil {
		return *m.ValLoss
	}
	return d
}

// line draws with Bresenham's algorithm.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	err := dx + dy
	for {
		img.SetRGBA(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func savePNG(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
