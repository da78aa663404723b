"""The engine host, the model picker, the Models dialog (library and this computer's models), the model's settings rows."""
