"""The Qt window: widgets render the models of app.components and forward input to them."""
