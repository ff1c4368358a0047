"""``python -m edgewise.hardness``: print the per-frame cost of hardness + policy."""

from __future__ import annotations

from edgewise.hardness.cost import measure_cost


def main() -> None:
    """Cost table for 0, 5, 20 and 100 boxes of 80 classes, then with motion at 1280x720."""
    for nb in (0, 5, 20, 100):
        r = measure_cost(n_boxes=nb)
        print(
            f"{nb:4d} boxes x {int(r['classes'])} classes: signals {r['signals_us']:7.1f} us  "
            f"policy {r['policy_us']:6.1f} us  total {r['total_us']:7.1f} us/frame (CPU time)"
        )
    r = measure_cost(n_frames=300, n_boxes=20, frame_size=(1280, 720))
    print(f"  20 boxes + motion at 1280x720: signals {r['signals_us']:7.1f} us  motion {r['motion_us']:7.1f} us  "
          f"policy {r['policy_us']:6.1f} us  total {r['total_us']:7.1f} us/frame (CPU time)")


if __name__ == "__main__":
    main()
