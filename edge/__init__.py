"""edgewise edge daemon (runs on Jetson Xavier NX, Python 3.8)."""
