"""The Qt window: widgets render the models of pagoda.app.components and forward input to them."""
